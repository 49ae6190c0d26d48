// go_contention.go: goroutines that wait in the ways Go's block profile
// counts and in one it does not, for the block profile of a Go program
// read from outside against what the program measured and against its own
// block profile (runtime/pprof, SetBlockProfileRate(1)) of the same run.
//
//	main.recvWait   receives from a channel fed every ~1 ms (the feeder
//	                sleeps in between)
//	main.lockWait   locks a sync.Mutex that main.holdLock holds 2 ms at a
//	                time (with 1 ms of work between holds), after 0.5 ms
//	                of work of its own
//	main.sleeper    sleeps 1 ms at a time (not a block event for Go)
//	main.napper     sleeps 1 ms at a time in a blocking system call
//	                (nanosleep): its thread is off the CPU, the goroutine
//	                stays on it
//
// The receiving goroutine runs under pprof.Do with the label
// waiter=receiver, the locking one under SetGoroutineLabels with
// waiter=locker, the napping one under pprof.Do with waiter=napper.
//
// usage: go_contention SECONDS PROFILE [--wait-stdin]
//
//	PROFILE       where runtime/pprof writes the program's own block profile
//	              (and PROFILE.mutex its mutex profile, at fraction 1)
//	--wait-stdin  print "ready pid=P", then read one byte (or EOF) from
//	              stdin before starting, so that a profiler can attach first
//
// At exit it prints one line to stdout:
//
//	pid=P recv_ns=A recv_waits=N lock_ns=B lock_waits=M sleep_ns=C nap_ns=D naps=E
//
// recv_ns and lock_ns are the time spent inside the channel receive and the
// Lock call, summed; sleep_ns the time asleep; nap_ns the time inside the
// nanosleep calls (with the wait for a P after each), naps their number.
//
// Build: go build -o go_contention go_contention.go
package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync"
	"syscall"
	"time"
)

var mu sync.Mutex

//go:noinline
func recvWait(ch chan int) time.Duration {
	t := time.Now()
	<-ch
	return time.Since(t)
}

//go:noinline
func lockWait() time.Duration {
	t := time.Now()
	mu.Lock()
	d := time.Since(t)
	mu.Unlock()
	return d
}

//go:noinline
func holdLock(d time.Duration) {
	mu.Lock()
	spin(d)
	mu.Unlock()
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

// spin works for d.
func spin(d time.Duration) {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
	}
}

//go:noinline
func sleeper() {
	time.Sleep(time.Millisecond)
}

//go:noinline
func napper() {
	ts := syscall.Timespec{Nsec: 1000000}
	syscall.Nanosleep(&ts, nil)
}

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: go_contention SECONDS PROFILE [--wait-stdin]")
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
	var wg sync.WaitGroup
	var recvNs, recvWaits, lockNs, lockWaits, sleepNs, napNs, naps int64
	ch := make(chan int)
	stop := make(chan struct{})
	// The feeder: one value every ~1 ms, asleep in between.
	go func() {
		for {
			time.Sleep(time.Millisecond)
			select {
			case ch <- 1:
			case <-stop:
				return
			}
		}
	}()
	wg.Add(5)
	go func() {
		defer wg.Done()
		labels := pprof.Labels("waiter", "receiver")
		pprof.Do(context.Background(), labels, func(context.Context) {
			for time.Now().Before(deadline) {
				recvNs += int64(recvWait(ch))
				recvWaits++
			}
		})
	}()
	go func() {
		defer wg.Done()
		for time.Now().Before(deadline) {
			holdLock(2 * time.Millisecond)
			// Let the waiter in before holding again.
			spin(time.Millisecond)
		}
	}()
	go func() {
		defer wg.Done()
		ctx := pprof.WithLabels(context.Background(), pprof.Labels("waiter", "locker"))
		pprof.SetGoroutineLabels(ctx)
		for time.Now().Before(deadline) {
			spin(500 * time.Microsecond)
			lockNs += int64(lockWait())
			lockWaits++
		}
	}()
	go func() {
		defer wg.Done()
		for time.Now().Before(deadline) {
			t := time.Now()
			sleeper()
			sleepNs += int64(time.Since(t))
		}
	}()
	go func() {
		defer wg.Done()
		labels := pprof.Labels("waiter", "napper")
		pprof.Do(context.Background(), labels, func(context.Context) {
			for time.Now().Before(deadline) {
				t := time.Now()
				napper()
				napNs += int64(time.Since(t))
				naps++
			}
		})
	}()
	wg.Wait()
	close(stop)
	write("block", os.Args[2])
	write("mutex", os.Args[2]+".mutex")
	fmt.Printf("pid=%d recv_ns=%d recv_waits=%d lock_ns=%d lock_waits=%d sleep_ns=%d nap_ns=%d naps=%d\n",
		os.Getpid(), recvNs, recvWaits, lockNs, lockWaits, sleepNs, napNs, naps)
}
