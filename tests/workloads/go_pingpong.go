// go_pingpong.go: two goroutines hand a token back and forth over
// unbuffered channels as fast as they can, each hand-off a park and a
// ready: the channel-heavy case of what probing Go's park points costs.
//
// usage: go_pingpong SECONDS [--wait-stdin]
//
// At exit it prints one line to stdout:
//
//	pid=P rounds=N
//
// Build: go build -o go_pingpong go_pingpong.go
package main

import (
	"fmt"
	"os"
	"strconv"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: go_pingpong SECONDS [--wait-stdin]")
		os.Exit(2)
	}
	seconds, err := strconv.ParseFloat(os.Args[1], 64)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bad SECONDS:", err)
		os.Exit(2)
	}
	if len(os.Args) > 2 && os.Args[2] == "--wait-stdin" {
		fmt.Printf("ready pid=%d\n", os.Getpid())
		buf := make([]byte, 1)
		os.Stdin.Read(buf)
	}
	ping, pong := make(chan int), make(chan int)
	go func() {
		for v := range ping {
			pong <- v
		}
		close(pong)
	}()
	deadline := time.Now().Add(time.Duration(seconds * float64(time.Second)))
	var rounds int64
	for time.Now().Before(deadline) {
		for i := 0; i < 100; i++ {
			ping <- i
			<-pong
		}
		rounds += 100
	}
	close(ping)
	fmt.Printf("pid=%d rounds=%d\n", os.Getpid(), rounds)
	os.Stdout.Sync()
	// Alive a while after the report: the bench reads its threads' CPU
	// time then, which an exited thread no longer shows.
	time.Sleep(time.Second)
}
