// go_heap.go: three allocation sites with known byte counts, for the heap
// profile of a Go program read from outside against what the program
// counted and against its own heap profile (runtime/pprof) of the same run.
//
//	main.allocSmall   64-byte objects, dropped at once (garbage)
//	main.allocLarge   8 KiB objects, dropped at once
//	main.retain       16 KiB objects, 8192 of them (128 MiB), kept until
//	                  exit (in use)
//
// usage: go_heap SECONDS PROFILE RATE [--wait-stdin]
//
//	PROFILE       where runtime/pprof writes the program's own heap profile
//	RATE          runtime.MemProfileRate to set first (0: leave Go's default)
//	--wait-stdin  print "ready pid=P", then read one byte (or EOF) from
//	              stdin before allocating, so that a profiler can attach first
//
// It allocates for SECONDS, runs a collection, writes its own heap profile,
// prints
//
//	pid=P small_bytes=A large_bytes=B retain_bytes=C retain_objects=N rounds=R
//
// then holds the retained objects for 3 s (so that a profiler's window ends
// while they are in use) and exits.
//
// Build: go build -o go_heap go_heap.go
package main

import (
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"time"
)

var sink []byte
var kept [][]byte

//go:noinline
func allocSmall() {
	sink = make([]byte, 64)
}

//go:noinline
func allocLarge() {
	sink = make([]byte, 8192)
}

//go:noinline
func retain() {
	kept = append(kept, make([]byte, 16384))
}

func main() {
	if len(os.Args) < 4 {
		fmt.Fprintln(os.Stderr, "usage: go_heap SECONDS PROFILE RATE [--wait-stdin]")
		os.Exit(2)
	}
	seconds, err := strconv.ParseFloat(os.Args[1], 64)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bad SECONDS:", err)
		os.Exit(2)
	}
	rate, err := strconv.Atoi(os.Args[3])
	if err != nil {
		fmt.Fprintln(os.Stderr, "bad RATE:", err)
		os.Exit(2)
	}
	if rate > 0 {
		runtime.MemProfileRate = rate
	}
	kept = make([][]byte, 0, 8192)
	if len(os.Args) > 4 && os.Args[4] == "--wait-stdin" {
		fmt.Printf("ready pid=%d\n", os.Getpid())
		buf := make([]byte, 1)
		os.Stdin.Read(buf)
	}
	var small, large, retained, retainedObjects, rounds int64
	deadline := time.Now().Add(time.Duration(seconds * float64(time.Second)))
	for time.Now().Before(deadline) {
		// One round: 64 KiB small, 64 KiB large, 16 KiB retained (until
		// 8192 objects are kept).
		for i := 0; i < 1024; i++ {
			allocSmall()
		}
		small += 1024 * 64
		for i := 0; i < 8; i++ {
			allocLarge()
		}
		large += 8 * 8192
		if retainedObjects < 8192 {
			retain()
			retained += 16384
			retainedObjects++
		}
		rounds++
	}
	sink = nil
	runtime.GC()
	f, err := os.Create(os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, "profile:", err)
		os.Exit(1)
	}
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		fmt.Fprintln(os.Stderr, "profile:", err)
		os.Exit(1)
	}
	f.Close()
	fmt.Printf("pid=%d small_bytes=%d large_bytes=%d retain_bytes=%d retain_objects=%d rounds=%d\n",
		os.Getpid(), small, large, retained, retainedObjects, rounds)
	os.Stdout.Sync()
	time.Sleep(3 * time.Second)
	runtime.KeepAlive(kept)
}
