// go_handlers.go: two request handlers, main.checkout and main.search,
// burn CPU in a 3:1 ratio of thread CPU time through one small helper,
// main.spin, a leaf without a frame of its own (it calls nothing and keeps
// everything in registers, so it saves no frame pointer). Each handler
// runs under pprof.Do with the label handler=checkout or handler=search,
// as a Go service labels its requests. The program writes its own CPU
// profile (runtime/pprof) of the same run, for comparison.
//
// usage: go_handlers SECONDS PROFILE [--wait-stdin]
//
//	PROFILE       where runtime/pprof writes the program's own CPU profile
//	--wait-stdin  print "ready pid=P", then read one byte (or EOF) from
//	              stdin before burning, so that a profiler can attach first
//
// At exit it prints one line to stdout:
//
//	pid=P cpu_ns=N checkout_ns=A search_ns=B spins=S
//
// checkout_ns and search_ns are the thread CPU time spent inside each
// handler (CLOCK_THREAD_CPUTIME_ID; the goroutine is locked to its thread);
// spins the calls of spin, the work done (throughput, for benchmarks).
//
// Build: go build -o go_handlers go_handlers.go
package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"syscall"
	"time"
	"unsafe"
)

// Thread CPU time of each request, on average: a 3.6 ms cycle, each
// cycle stretched by a pseudo-random factor from 0.6 to 1.4 so that no
// sampling period (Go's own is 10 ms) beats with it.
const (
	checkoutNs = 2700000
	searchNs   = 900000
)

var jitter uint64 = 88172645463325252

// stretch returns ns times a factor from 0.6 to 1.4 (xorshift).
func stretch(ns int64, factor int64) int64 {
	return ns * factor / 1000
}

func nextFactor() int64 {
	jitter ^= jitter << 13
	jitter ^= jitter >> 7
	jitter ^= jitter << 17
	return 600 + int64(jitter%801)
}

var sink uint64

// spins counts the calls of spin: the work done, for throughput.
var spins int64

func threadCPU() int64 {
	var ts syscall.Timespec
	// CLOCK_THREAD_CPUTIME_ID
	syscall.Syscall(syscall.SYS_CLOCK_GETTIME, 3, uintptr(unsafe.Pointer(&ts)), 0)
	return ts.Nano()
}

// spin is the leaf both handlers share: a loop on registers, no frame.
//
//go:noinline
func spin(n int, x uint64) uint64 {
	for i := 0; i < n; i++ {
		x = x*6364136223846793005 + 1442695040888963407
	}
	return x
}

// checkout and search each call spin until `ns` of thread CPU time have
// passed: spin's caller is the handler itself.
//
//go:noinline
func checkout(ns int64) int64 {
	start := threadCPU()
	x := sink
	for threadCPU()-start < ns {
		x = spin(20000, x)
		spins++
	}
	sink = x
	return threadCPU() - start
}

//go:noinline
func search(ns int64) int64 {
	start := threadCPU()
	x := sink
	for threadCPU()-start < ns {
		x = spin(20000, x)
		spins++
	}
	sink = x
	return threadCPU() - start
}

//go:noinline
func serve(seconds float64) (int64, int64) {
	var a, b int64
	ctx := context.Background()
	end := time.Now().Add(time.Duration(seconds * float64(time.Second)))
	for time.Now().Before(end) {
		f := nextFactor()
		pprof.Do(ctx, pprof.Labels("handler", "checkout"), func(context.Context) {
			a += checkout(stretch(checkoutNs, f))
		})
		pprof.Do(ctx, pprof.Labels("handler", "search"), func(context.Context) {
			b += search(stretch(searchNs, f))
		})
	}
	return a, b
}

func main() {
	runtime.LockOSThread()
	if len(os.Args) < 3 {
		fmt.Fprintf(os.Stderr, "usage: %s SECONDS PROFILE [--wait-stdin]\n", os.Args[0])
		os.Exit(2)
	}
	seconds, err := strconv.ParseFloat(os.Args[1], 64)
	if err != nil || seconds <= 0 {
		fmt.Fprintf(os.Stderr, "bad SECONDS %s\n", os.Args[1])
		os.Exit(2)
	}
	for _, arg := range os.Args[3:] {
		if arg != "--wait-stdin" {
			fmt.Fprintf(os.Stderr, "unknown argument %s\n", arg)
			os.Exit(2)
		}
		fmt.Printf("ready pid=%d\n", os.Getpid())
		var one [1]byte
		os.Stdin.Read(one[:])
	}
	out, err := os.Create(os.Args[2])
	if err != nil {
		fmt.Fprintf(os.Stderr, "cannot create %s: %v\n", os.Args[2], err)
		os.Exit(1)
	}
	if err := pprof.StartCPUProfile(out); err != nil {
		fmt.Fprintf(os.Stderr, "cannot profile: %v\n", err)
		os.Exit(1)
	}
	a, b := serve(seconds)
	pprof.StopCPUProfile()
	if err := out.Close(); err != nil {
		fmt.Fprintf(os.Stderr, "cannot write %s: %v\n", os.Args[2], err)
		os.Exit(1)
	}
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	cpu := ru.Utime.Nano() + ru.Stime.Nano()
	fmt.Printf("pid=%d cpu_ns=%d checkout_ns=%d search_ns=%d spins=%d\n", os.Getpid(), cpu, a, b, spins)
}
