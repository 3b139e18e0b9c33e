// Command echo is proctest's test subject: it echoes lines on a TCP address
// until SIGTERM, logging to stderr.
package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	lis, err := net.Listen("tcp", os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "listening, greeting=%s\n", os.Getenv("PROCTEST_GREETING"))
	go func() {
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				sc := bufio.NewScanner(conn)
				for sc.Scan() {
					fmt.Fprintln(conn, sc.Text())
				}
			}()
		}
	}()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	<-sigs
	fmt.Fprintln(os.Stderr, "bye")
}
