// go_goroutines.go: goroutines parked in known ways, some under pprof
// labels, for the goroutine profile of a Go program read from outside
// against its own goroutine profile (runtime/pprof) of the same moment.
//
//	main.recvWait    3  receive from a channel nobody sends on (labels
//	                    role=receiver, shard=N for the Nth)
//	main.sendWait    2  send on an unbuffered channel nobody receives from
//	main.lockWait    5  lock a sync.Mutex that main holds
//	main.selectWait  4  select on two channels nobody sends on
//	main.condWait    2  wait on a sync.Cond nobody signals
//	main.groupWait   3  wait on a sync.WaitGroup that never finishes
//	main.sleeper     6  sleep for an hour
//
// usage: go_goroutines SECONDS PROFILE [--wait-stdin]
//
//	PROFILE       where the program writes its own goroutine profile
//	              (debug=0, the pprof proto) once every goroutine above is
//	              parked, and PROFILE.txt the same as text (debug=2, each
//	              goroutine with its wait reason)
//	--wait-stdin  print "ready pid=P", then read one byte (or EOF) from
//	              stdin before starting, so that a profiler can attach first
//
// It then stays SECONDS with the goroutines parked (main asleep), and
// prints one line to stdout before it exits:
//
//	pid=P goroutines=N
//
// N is runtime.NumGoroutine() while they were parked.
//
// Build: go build -o go_goroutines go_goroutines.go
package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"
)

var (
	mu      sync.Mutex
	never   = make(chan int)
	never2  = make(chan int)
	idle1   = make(chan int)
	idle2   = make(chan int)
	condMu  sync.Mutex
	cond    = sync.NewCond(&condMu)
	pending sync.WaitGroup
	started sync.WaitGroup
)

//go:noinline
func recvWait() { started.Done(); <-never }

//go:noinline
func sendWait() { started.Done(); never2 <- 1 }

//go:noinline
func lockWait() {
	started.Done()
	mu.Lock()
	mu.Unlock()
}

//go:noinline
func selectWait() {
	started.Done()
	select {
	case <-idle1:
	case <-idle2:
	}
}

//go:noinline
func condWait() {
	condMu.Lock()
	started.Done()
	cond.Wait()
	condMu.Unlock()
}

//go:noinline
func groupWait() { started.Done(); pending.Wait() }

//go:noinline
func sleeper() { started.Done(); time.Sleep(time.Hour) }

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: go_goroutines SECONDS PROFILE [--wait-stdin]")
		os.Exit(2)
	}
	seconds, err := strconv.ParseFloat(os.Args[1], 64)
	if err != nil || seconds <= 0 {
		fmt.Fprintln(os.Stderr, "go_goroutines: SECONDS must be a positive number")
		os.Exit(2)
	}
	if len(os.Args) > 3 && os.Args[3] == "--wait-stdin" {
		fmt.Printf("ready pid=%d\n", os.Getpid())
		var b [1]byte
		os.Stdin.Read(b[:])
	}
	mu.Lock()
	pending.Add(1)
	spawn := func(n int, f func()) {
		for i := 0; i < n; i++ {
			started.Add(1)
			go f()
		}
	}
	for i := 0; i < 3; i++ {
		started.Add(1)
		labels := pprof.Labels("role", "receiver", "shard", strconv.Itoa(i))
		go pprof.Do(context.Background(), labels, func(context.Context) { recvWait() })
	}
	spawn(2, sendWait)
	spawn(5, lockWait)
	spawn(4, selectWait)
	spawn(2, condWait)
	spawn(3, groupWait)
	spawn(6, sleeper)
	started.Wait()
	// Each has signalled just before it parks: let every one get there.
	time.Sleep(300 * time.Millisecond)
	count := runtime.NumGoroutine()
	write := func(path string, debug int) {
		f, err := os.Create(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, "go_goroutines:", err)
			os.Exit(1)
		}
		if err := pprof.Lookup("goroutine").WriteTo(f, debug); err != nil {
			fmt.Fprintln(os.Stderr, "go_goroutines:", err)
			os.Exit(1)
		}
		f.Close()
	}
	write(os.Args[2], 0)
	write(os.Args[2]+".txt", 2)
	time.Sleep(time.Duration(seconds * float64(time.Second)))
	// The release's minor number, by which the tests expect its wait
	// reasons ("go1.19.8": 19).
	minor := 0
	if parts := strings.Split(runtime.Version(), "."); len(parts) > 1 {
		minor, _ = strconv.Atoi(parts[1])
	}
	fmt.Printf("pid=%d goroutines=%d go_minor=%d\n", os.Getpid(), count, minor)
}
