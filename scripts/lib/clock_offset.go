// Added to the standard library's time package by `scripts/control-plane build-clock-offset`
// (a -overlay; not built with the repository): time.Now reads the wall clock through
// offsetRuntimeNow, CONTROL_PLANE_CLOCK_OFFSET (a Go duration) off, so one kube-apiserver of an
// HA test plane runs with its clock off as a server whose NTP drifted. libfaketime cannot do
// this for Go, which reads the clock from the vDSO. The monotonic reading stays true, so timers,
// timeouts and durations are unchanged.

package time

import (
	"sync"
	"syscall"
)

var (
	clockOffsetOnce  sync.Once
	clockOffsetNanos int64
)

func offsetRuntimeNow() (int64, int32, int64) {
	clockOffsetOnce.Do(func() {
		if value, ok := syscall.Getenv("CONTROL_PLANE_CLOCK_OFFSET"); ok {
			offset, err := ParseDuration(value)
			if err != nil {
				panic("CONTROL_PLANE_CLOCK_OFFSET=" + value + ": " + err.Error())
			}
			clockOffsetNanos = int64(offset)
		}
	})
	sec, nsec, mono := runtimeNow()
	if clockOffsetNanos == 0 {
		return sec, nsec, mono
	}
	wall := sec*1e9 + int64(nsec) + clockOffsetNanos
	sec, rest := wall/1e9, wall%1e9
	if rest < 0 {
		sec, rest = sec-1, rest+1e9
	}
	return sec, int32(rest), mono
}
