// Command tekton-netns runs a command (the Tekton controller) in a network namespace of its own
// whose only way out is one forwarded loopback port: the API server's.
//
//	tekton-netns PORT -- COMMAND [ARG...]
//
// The Tekton controller and knative's shared main bind fixed ports (8080 for knative's probes)
// on every interface; in a namespace of its own each controller has its own, so two control
// planes never collide and nothing is exposed outside the machine. 127.0.0.1:PORT inside the
// namespace forwards to 127.0.0.1:PORT outside, so the controller uses the admin kubeconfig
// unchanged. SIGTERM and SIGINT are passed on; the command is killed if this process dies; the
// exit status is the command's. Needs CAP_SYS_ADMIN (root).
package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 4 || os.Args[2] != "--" {
		fmt.Fprintln(os.Stderr, "usage: tekton-netns PORT -- COMMAND [ARG...]")
		os.Exit(2)
	}
	target := net.JoinHostPort("127.0.0.1", os.Args[1])
	cmd := exec.Command(os.Args[3], os.Args[4:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	// Pdeathsig follows the forking thread, which stays alive (locked, waiting) until the end.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}

	started := make(chan net.Listener)
	failed := make(chan error, 1)
	exited := make(chan error, 1)
	go func() {
		// Only this thread enters the new namespace; the runtime starts further threads from a
		// clean template thread, so every other goroutine (the dialer) stays outside. The thread
		// is never unlocked, so it ends with this goroutine instead of being reused.
		runtime.LockOSThread()
		listener, err := enterNamespace(target)
		if err != nil {
			failed <- err
			return
		}
		if err := cmd.Start(); err != nil {
			failed <- fmt.Errorf("start %s: %w", cmd.Path, err)
			return
		}
		started <- listener
		exited <- cmd.Wait()
	}()

	var listener net.Listener
	select {
	case err := <-failed:
		fmt.Fprintln(os.Stderr, "tekton-netns:", err)
		os.Exit(1)
	case listener = <-started:
	}
	go forward(listener, target)

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	for {
		select {
		case sig := <-signals:
			_ = cmd.Process.Signal(sig)
		case err := <-exited:
			if exit, ok := err.(*exec.ExitError); ok {
				os.Exit(exit.ExitCode())
			}
			if err != nil {
				fmt.Fprintln(os.Stderr, "tekton-netns:", err)
				os.Exit(1)
			}
			os.Exit(0)
		}
	}
}

// enterNamespace moves the calling (locked) thread into a new network namespace, brings its
// loopback up and listens there on target.
func enterNamespace(target string) (net.Listener, error) {
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return nil, fmt.Errorf("unshare the network namespace (needs root): %w", err)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	ifreq, err := unix.NewIfreq("lo")
	if err != nil {
		return nil, err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifreq); err != nil {
		return nil, fmt.Errorf("read the flags of lo: %w", err)
	}
	ifreq.SetUint16(ifreq.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifreq); err != nil {
		return nil, fmt.Errorf("bring lo up: %w", err)
	}
	listener, err := net.Listen("tcp", target)
	if err != nil {
		return nil, fmt.Errorf("listen on %s in the namespace: %w", target, err)
	}
	return listener, nil
}

// forward copies each connection accepted inside the namespace to a new one to target outside.
func forward(listener net.Listener, target string) {
	for {
		inside, err := listener.Accept()
		if err != nil {
			fmt.Fprintln(os.Stderr, "tekton-netns: accept:", err)
			return
		}
		go func() {
			defer inside.Close()
			outside, err := net.Dial("tcp", target)
			if err != nil {
				fmt.Fprintln(os.Stderr, "tekton-netns: dial:", err)
				return
			}
			defer outside.Close()
			done := make(chan struct{}, 2)
			go func() { _, _ = io.Copy(outside, inside); done <- struct{}{} }()
			go func() { _, _ = io.Copy(inside, outside); done <- struct{}{} }()
			<-done
		}()
	}
}
