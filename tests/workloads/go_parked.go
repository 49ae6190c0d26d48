// go_parked.go: many goroutines parked eight calls deep, half of them
// under pprof labels, for the cost of a goroutine profile read from
// outside against the program's own (runtime/pprof).
//
// usage: go_parked SECONDS N [--wait-stdin]
//
//	N             goroutines to park
//	--wait-stdin  print "ready pid=P", then read one byte (or EOF) from
//	              stdin before starting, so that a profiler can attach first
//
// Once they are parked it writes its own goroutine profile (debug=0) five
// times to a discarding writer, stays SECONDS, and prints one line:
//
//	pid=P goroutines=G own_profile_us=U
//
// U is the median time of one of its own goroutine profiles, in
// microseconds (runtime/pprof stops the world to take it).
//
// Build: go build -o go_parked go_parked.go
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"sort"
	"strconv"
	"sync"
	"time"
)

var (
	never   = make(chan int)
	started sync.WaitGroup
)

//go:noinline
func deep(n int) int {
	if n == 0 {
		started.Done()
		return <-never
	}
	return deep(n-1) + 1
}

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: go_parked SECONDS N [--wait-stdin]")
		os.Exit(2)
	}
	seconds, err := strconv.ParseFloat(os.Args[1], 64)
	n, err2 := strconv.Atoi(os.Args[2])
	if err != nil || err2 != nil || seconds <= 0 || n < 0 {
		fmt.Fprintln(os.Stderr, "go_parked: SECONDS and N must be positive numbers")
		os.Exit(2)
	}
	if len(os.Args) > 3 && os.Args[3] == "--wait-stdin" {
		fmt.Printf("ready pid=%d\n", os.Getpid())
		var b [1]byte
		os.Stdin.Read(b[:])
	}
	for i := 0; i < n; i++ {
		started.Add(1)
		if i%2 == 0 {
			labels := pprof.Labels("shard", strconv.Itoa(i%16))
			go pprof.Do(context.Background(), labels, func(context.Context) { deep(8) })
		} else {
			go deep(8)
		}
	}
	started.Wait()
	time.Sleep(200 * time.Millisecond)
	count := runtime.NumGoroutine()
	var took []time.Duration
	for i := 0; i < 5; i++ {
		t := time.Now()
		if err := pprof.Lookup("goroutine").WriteTo(io.Discard, 0); err != nil {
			fmt.Fprintln(os.Stderr, "go_parked:", err)
			os.Exit(1)
		}
		took = append(took, time.Since(t))
	}
	sort.Slice(took, func(a, b int) bool { return took[a] < took[b] })
	time.Sleep(time.Duration(seconds * float64(time.Second)))
	fmt.Printf("pid=%d goroutines=%d own_profile_us=%d\n", os.Getpid(), count, took[2].Microseconds())
}
