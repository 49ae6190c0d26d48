// cpu_ratio.go: burns CPU in main.burn_a and main.burn_b in a 3:1 ratio of
// thread CPU time, for a wall-clock duration, and reports what it measured
// itself: the Go twin of cpu_ratio.c.
//
// usage: cpu_ratio SECONDS [--wait-stdin]
//
//	--wait-stdin  print "ready pid=P", then read one byte (or EOF) from
//	              stdin before burning, so that a profiler can attach first
//
// At exit it prints one line to stdout:
//
//	pid=P cpu_ns=N a_ns=A b_ns=B
//
// cpu_ns is the process's user+system time (getrusage RUSAGE_SELF), a_ns and
// b_ns the thread CPU time spent inside burn_a and burn_b
// (CLOCK_THREAD_CPUTIME_ID; the goroutine is locked to its thread).
//
// Build: go build -o cpu_ratio cpu_ratio.go (stripped: -ldflags='-s -w')
package main

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"time"
	"unsafe"
)

// Thread CPU time of each slice (see cpu_ratio.c: a 3.6 ms cycle, no
// multiple of the tests' sampling periods).
const (
	sliceA = 2700000
	sliceB = 900000
)

var sink uint64

func threadCPU() int64 {
	var ts syscall.Timespec
	// CLOCK_THREAD_CPUTIME_ID
	syscall.Syscall(syscall.SYS_CLOCK_GETTIME, 3, uintptr(unsafe.Pointer(&ts)), 0)
	return ts.Nano()
}

// burn_a and burn_b burn for `ns` of thread CPU time and return it. The
// arithmetic is in their own loop: a leaf without a frame of its own (a
// helper doing it) would hide its caller from a frame-pointer walk.
//
//go:noinline
func burn_a(ns int64) int64 {
	start := threadCPU()
	x := sink
	for threadCPU()-start < ns {
		for i := 0; i < 20000; i++ {
			x = x*6364136223846793005 + 1442695040888963407
		}
	}
	sink = x
	return threadCPU() - start
}

//go:noinline
func burn_b(ns int64) int64 {
	start := threadCPU()
	x := sink
	for threadCPU()-start < ns {
		for i := 0; i < 20000; i++ {
			x = x*6364136223846793005 + 1442695040888963407
		}
	}
	sink = x
	return threadCPU() - start
}

//go:noinline
func run_workload(seconds float64) (int64, int64) {
	var a, b int64
	end := time.Now().Add(time.Duration(seconds * float64(time.Second)))
	for time.Now().Before(end) {
		a += burn_a(sliceA)
		b += burn_b(sliceB)
	}
	return a, b
}

func main() {
	runtime.LockOSThread()
	if len(os.Args) < 2 {
		fmt.Fprintf(os.Stderr, "usage: %s SECONDS [--wait-stdin]\n", os.Args[0])
		os.Exit(2)
	}
	seconds, err := strconv.ParseFloat(os.Args[1], 64)
	if err != nil || seconds <= 0 {
		fmt.Fprintf(os.Stderr, "bad SECONDS %s\n", os.Args[1])
		os.Exit(2)
	}
	for _, arg := range os.Args[2:] {
		if arg != "--wait-stdin" {
			fmt.Fprintf(os.Stderr, "unknown argument %s\n", arg)
			os.Exit(2)
		}
		fmt.Printf("ready pid=%d\n", os.Getpid())
		var one [1]byte
		os.Stdin.Read(one[:])
	}
	a, b := run_workload(seconds)
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	cpu := ru.Utime.Nano() + ru.Stime.Nano()
	fmt.Printf("pid=%d cpu_ns=%d a_ns=%d b_ns=%d\n", os.Getpid(), cpu, a, b)
}
