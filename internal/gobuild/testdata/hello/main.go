// Command hello is what gobuild's tests build: a main package with no
// imports, so that building it compiles little more than the runtime.
package main

func main() { println("hello") }
