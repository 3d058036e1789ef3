/// A wake-up that a sleeping thread waits for: signals before the wait are kept (as one), so none
/// is missed. A monitor over one flag; it replaces a semaphore used as a doorbell.
package final class WakeSignal: Sendable {
    private let pending = Monitor(false)

    package init() {}

    /// Wakes the waiter, or the next wait if none waits now.
    package func signal() { pending.withLock { $0 = true } }

    /// Waits for a signal or until `timeout` passes; returns whether it was signalled.
    @discardableResult
    package func wait(timeout: Duration? = nil) -> Bool {
        pending.wait(until: { $0 }, timeout: timeout) { pending in pending = false } != nil
    }
}

/// Work that has begun and not yet ended, to wait for its end: a monitor over a count. It
/// replaces a dispatch group.
package final class WorkCount: Sendable {
    private let count = Monitor(0)

    package init() {}

    package func enter() { count.withLock(wake: false) { $0 += 1 } }

    package func leave() { count.withLock { $0 -= 1 } }

    /// Waits until all work that began has ended, or `timeout` passes; returns whether it ended.
    @discardableResult
    package func wait(timeout: Duration? = nil) -> Bool {
        count.wait(until: { $0 <= 0 }, timeout: timeout) { _ in () } != nil
    }
}
