// go_locks.go: contention as real Go programs have it, several goroutines
// queued on one lock at once, for the block and mutex profiles of a Go
// program read from outside against its own (runtime/pprof,
// SetBlockProfileRate(1), SetMutexProfileFraction(1)) of the same run:
//
//	main.holder       holds sync.Mutex mu 2 ms at a time (asleep), 0.5 ms
//	                  apart
//	main.lockWaiter   three goroutines that lock mu (each unlocks at once,
//	                  itself releasing the next waiter)
//	main.rwWriter     holds sync.RWMutex rw for writing 2 ms at a time,
//	                  1 ms apart (asleep)
//	main.rwReader     two goroutines that read-lock rw (released together
//	                  by the writer's Unlock) and hold it 0.3 ms (the
//	                  writer's Lock waits for them)
//	main.wgWaiter     waits on a sync.WaitGroup that main.wgWorker marks
//	                  done after 1 ms (a block event; never a mutex one)
//
// usage: go_locks SECONDS PROFILE [--wait-stdin]
//
//	PROFILE       where runtime/pprof writes the program's own block profile
//	              (and PROFILE.mutex its mutex profile)
//	--wait-stdin  print "ready pid=P", then read one byte (or EOF) from
//	              stdin before starting, so that a profiler can attach first
//
// At exit it prints
//
//	pid=P lock_ns=A locks=N rlock_ns=B rlocks=M wg_ns=C wgs=K
//
// the time spent inside Lock, RLock and Wait calls, summed, and their
// number.
//
// Build: go build -o go_locks go_locks.go
package main

import (
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

var (
	mu sync.Mutex
	rw sync.RWMutex
)

// spin works for d.
func spin(d time.Duration) {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
	}
}

//go:noinline
func holder(deadline time.Time) {
	for time.Now().Before(deadline) {
		mu.Lock()
		time.Sleep(2 * time.Millisecond)
		mu.Unlock()
		time.Sleep(500 * time.Microsecond)
	}
}

//go:noinline
func lockWaiter(deadline time.Time, ns, n *int64) {
	for time.Now().Before(deadline) {
		spin(100 * time.Microsecond)
		t := time.Now()
		mu.Lock()
		atomic.AddInt64(ns, int64(time.Since(t)))
		atomic.AddInt64(n, 1)
		mu.Unlock()
	}
}

//go:noinline
func rwWriter(deadline time.Time) {
	for time.Now().Before(deadline) {
		rw.Lock()
		time.Sleep(2 * time.Millisecond)
		rw.Unlock()
		time.Sleep(time.Millisecond)
	}
}

//go:noinline
func rwReader(deadline time.Time, ns, n *int64) {
	for time.Now().Before(deadline) {
		t := time.Now()
		rw.RLock()
		atomic.AddInt64(ns, int64(time.Since(t)))
		atomic.AddInt64(n, 1)
		// Held a while: the writer's Lock waits for the readers too.
		time.Sleep(300 * time.Microsecond)
		rw.RUnlock()
		time.Sleep(500 * time.Microsecond)
	}
}

//go:noinline
func wgWorker(wg *sync.WaitGroup) {
	time.Sleep(time.Millisecond)
	wg.Done()
}

//go:noinline
func wgWaiter(deadline time.Time, ns, n *int64) {
	for time.Now().Before(deadline) {
		var wg sync.WaitGroup
		wg.Add(1)
		go wgWorker(&wg)
		t := time.Now()
		wg.Wait()
		*ns += int64(time.Since(t))
		*n++
	}
}

// write writes the runtime's profile `name` to `path`.
func write(name, path string) {
	f, err := os.Create(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "profile:", err)
		os.Exit(1)
	}
	if err := pprof.Lookup(name).WriteTo(f, 0); err != nil {
		fmt.Fprintln(os.Stderr, "profile:", err)
		os.Exit(1)
	}
	f.Close()
}

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: go_locks SECONDS PROFILE [--wait-stdin]")
		os.Exit(2)
	}
	seconds, err := strconv.ParseFloat(os.Args[1], 64)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bad SECONDS:", err)
		os.Exit(2)
	}
	runtime.SetBlockProfileRate(1)
	runtime.SetMutexProfileFraction(1)
	if len(os.Args) > 3 && os.Args[3] == "--wait-stdin" {
		fmt.Printf("ready pid=%d\n", os.Getpid())
		buf := make([]byte, 1)
		os.Stdin.Read(buf)
	}
	deadline := time.Now().Add(time.Duration(seconds * float64(time.Second)))
	var lockNs, locks, rlockNs, rlocks, wgNs, wgs int64
	var done sync.WaitGroup
	run := func(f func()) {
		done.Add(1)
		go func() {
			defer done.Done()
			f()
		}()
	}
	run(func() { holder(deadline) })
	for i := 0; i < 3; i++ {
		run(func() { lockWaiter(deadline, &lockNs, &locks) })
	}
	run(func() { rwWriter(deadline) })
	for i := 0; i < 2; i++ {
		run(func() { rwReader(deadline, &rlockNs, &rlocks) })
	}
	run(func() { wgWaiter(deadline, &wgNs, &wgs) })
	done.Wait()
	write("block", os.Args[2])
	write("mutex", os.Args[2]+".mutex")
	fmt.Printf("pid=%d lock_ns=%d locks=%d rlock_ns=%d rlocks=%d wg_ns=%d wgs=%d\n",
		os.Getpid(), lockNs, locks, rlockNs, rlocks, wgNs, wgs)
}
