package main

import (
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
)

func getenvFrom(env map[string]string) func(string) string {
	return func(k string) string { return env[k] }
}

func TestParseConfigDefaults(t *testing.T) {
	cfg, err := parseConfig(nil, getenvFrom(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := config{listen: "127.0.0.1:50052", dedupeAddr: "127.0.0.1:50051", replayCacheBytes: 64 << 20}
	if cfg != want {
		t.Errorf("defaults = %+v, want %+v", cfg, want)
	}
	if got := cfg.replayCache(); got != "off" {
		t.Errorf("replay cache by default: %q, want off", got)
	}
}

func TestParseConfigReplayCache(t *testing.T) {
	for _, tc := range []struct {
		name      string
		args      []string
		env       map[string]string
		entries   int
		bytes     int
		startLine string
	}{
		{"flag, default bytes", []string{"-replay-cache-entries", "1000"}, nil, 1000, 64 << 20, "entries=1000 bytes=67108864 ttl=1m0s"},
		{"both flags", []string{"-replay-cache-entries=10", "-replay-cache-bytes=4096"}, nil, 10, 4096, "entries=10 bytes=4096 ttl=1m0s"},
		{"environment", nil, map[string]string{"PAYMENTS_REPLAY_CACHE_ENTRIES": "5", "PAYMENTS_REPLAY_CACHE_BYTES": "2048"}, 5, 2048, "entries=5 bytes=2048 ttl=1m0s"},
		{"a flag overrides the environment", []string{"-replay-cache-entries=0"}, map[string]string{"PAYMENTS_REPLAY_CACHE_ENTRIES": "5"}, 0, 64 << 20, "off"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := parseConfig(tc.args, getenvFrom(tc.env), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.replayCacheEntries != tc.entries || cfg.replayCacheBytes != tc.bytes {
				t.Errorf("entries %d, bytes %d; want %d, %d", cfg.replayCacheEntries, cfg.replayCacheBytes, tc.entries, tc.bytes)
			}
			if got := cfg.replayCache(); got != tc.startLine {
				t.Errorf("start-up line says replay_cache=%q, want %q", got, tc.startLine)
			}
		})
	}
}

func TestParseConfigRefusesBadReplayCacheValues(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		// want is what the error must name.
		want string
	}{
		{"negative entries", []string{"-replay-cache-entries=-1"}, nil, "-replay-cache-entries"},
		{"zero bytes", []string{"-replay-cache-entries=10", "-replay-cache-bytes=0"}, nil, "-replay-cache-bytes"},
		{"negative bytes", []string{"-replay-cache-entries=10", "-replay-cache-bytes=-5"}, nil, "-replay-cache-bytes"},
		{"bytes without entries", []string{"-replay-cache-bytes=4096"}, nil, "-replay-cache-entries"},
		{"bytes from the environment without entries", nil, map[string]string{"PAYMENTS_REPLAY_CACHE_BYTES": "4096"}, "-replay-cache-entries"},
		{"unparsable entries variable", nil, map[string]string{"PAYMENTS_REPLAY_CACHE_ENTRIES": "many"}, "PAYMENTS_REPLAY_CACHE_ENTRIES"},
		{"unparsable bytes variable", nil, map[string]string{"PAYMENTS_REPLAY_CACHE_ENTRIES": "10", "PAYMENTS_REPLAY_CACHE_BYTES": "64MiB"}, "-replay-cache-bytes"},
		{"unparsable flag", []string{"-replay-cache-entries=lots"}, nil, "-replay-cache-entries"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseConfig(tc.args, getenvFrom(tc.env), io.Discard)
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not name %s", err, tc.want)
			}
		})
	}
}

func TestParseConfigOtherFlagsKeepTheirEnvironment(t *testing.T) {
	cfg, err := parseConfig(nil, getenvFrom(map[string]string{
		"PAYMENTS_LISTEN": "127.0.0.1:6000", "IDEMGATE_DEDUPE_ADDR": "127.0.0.1:6001",
		"IDEMGATE_DEDUPE_TOKEN": "tok", "PAYMENTS_REFLECTION": "true",
	}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := config{listen: "127.0.0.1:6000", dedupeAddr: "127.0.0.1:6001", token: "tok", reflection: true, replayCacheBytes: 64 << 20}
	if cfg != want {
		t.Errorf("config = %+v, want %+v", cfg, want)
	}
}

func TestParseConfigHelp(t *testing.T) {
	var usage strings.Builder
	if _, err := parseConfig([]string{"-h"}, getenvFrom(nil), &usage); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v, want flag.ErrHelp", err)
	}
	for _, s := range []string{"PAYMENTS_REPLAY_CACHE_ENTRIES", "PAYMENTS_REPLAY_CACHE_BYTES", "(default 67108864)"} {
		if !strings.Contains(usage.String(), s) {
			t.Errorf("usage does not mention %s:\n%s", s, usage.String())
		}
	}
}
