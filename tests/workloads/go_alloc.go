// go_alloc.go: a Go program that links no profiler (neither runtime/pprof
// nor net/http/pprof), as most Go services built without them are: Go's
// linker then sets runtime.disableMemoryProfiling and the runtime samples
// no allocation at all (runtime.MemProfileRate is 0 from its start) unless
// the program sets a rate itself. For the heap profile of such a program
// read from outside, against the bytes it counted.
//
//	main.allocKiB      1 KiB objects, dropped at once (garbage)
//	main.allocQuarter  256 KiB objects, dropped at once
//
// usage: go_alloc SECONDS RATE [--wait-stdin]
//
//	RATE          runtime.MemProfileRate to set first (0: leave it as the
//	              runtime left it)
//	--wait-stdin  print "ready pid=P", then read one byte (or EOF) from
//	              stdin before allocating, so that a profiler can attach first
//
// It allocates for SECONDS and exits at once (a profile window that closes
// after its exit holds its last allocations), printing
//
//	pid=P rate_at_start=R rate_at_end=S kib_bytes=A quarter_bytes=B kib_sampled_bytes=C quarter_sampled_bytes=D
//
// rate_at_start is runtime.MemProfileRate as main found it, rate_at_end as
// it was at the end (a profiler may have set it meanwhile); the *_sampled
// counts are the bytes allocated while the rate was above 0.
//
// Build: go build -o go_alloc go_alloc.go
package main

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"time"
)

var sink []byte

//go:noinline
func allocKiB() {
	sink = make([]byte, 1024)
}

//go:noinline
func allocQuarter() {
	sink = make([]byte, 256*1024)
}

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: go_alloc SECONDS RATE [--wait-stdin]")
		os.Exit(2)
	}
	seconds, err := strconv.ParseFloat(os.Args[1], 64)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bad SECONDS:", err)
		os.Exit(2)
	}
	rate, err := strconv.Atoi(os.Args[2])
	if err != nil || rate < 0 {
		fmt.Fprintln(os.Stderr, "bad RATE:", os.Args[2])
		os.Exit(2)
	}
	atStart := runtime.MemProfileRate
	if rate > 0 {
		runtime.MemProfileRate = rate
	}
	if len(os.Args) > 3 && os.Args[3] == "--wait-stdin" {
		fmt.Printf("ready pid=%d\n", os.Getpid())
		buf := make([]byte, 1)
		os.Stdin.Read(buf)
	}
	deadline := time.Now().Add(time.Duration(seconds * float64(time.Second)))
	var kib, quarter, kibSampled, quarterSampled int64
	for time.Now().Before(deadline) {
		// Read before the round: a profiler may set it at any time.
		sampled := runtime.MemProfileRate > 0
		// As many bytes at each site.
		for i := 0; i < 256; i++ {
			allocKiB()
		}
		kib += 256 * 1024
		allocQuarter()
		quarter += 256 * 1024
		if sampled {
			kibSampled += 256 * 1024
			quarterSampled += 256 * 1024
		}
	}
	fmt.Printf("pid=%d rate_at_start=%d rate_at_end=%d kib_bytes=%d quarter_bytes=%d kib_sampled_bytes=%d quarter_sampled_bytes=%d\n",
		os.Getpid(), atStart, runtime.MemProfileRate, kib, quarter, kibSampled, quarterSampled)
}
