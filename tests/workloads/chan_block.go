// Goroutines that block receiving from a channel, for the block profile's
// Go park points: four consumers wait in main.consumer while main sends a
// value every 2 ms. Each consumer measures how long its receives blocked;
// the total is printed as `blocked_ns=N pid=P`.
// With --wait-stdin it waits for a byte on stdin before starting.
package main

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

//go:noinline
func consumer(ch chan int, total *int64, wg *sync.WaitGroup) {
	defer wg.Done()
	var blocked int64
	for {
		t := time.Now()
		_, ok := <-ch
		blocked += int64(time.Since(t))
		if !ok {
			break
		}
	}
	atomic.AddInt64(total, blocked)
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "--wait-stdin" {
		fmt.Printf("ready pid=%d\n", os.Getpid())
		var b [1]byte
		if n, _ := os.Stdin.Read(b[:]); n != 1 {
			os.Exit(1)
		}
	}
	ch := make(chan int)
	var total int64
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go consumer(ch, &total, &wg)
	}
	for i := 0; i < 500; i++ {
		time.Sleep(2 * time.Millisecond)
		ch <- i
	}
	close(ch)
	wg.Wait()
	fmt.Printf("blocked_ns=%d pid=%d\n", atomic.LoadInt64(&total), os.Getpid())
}
