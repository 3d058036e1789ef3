#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// A mutex with a place in the lock order (``LockRank``), for locks that are held across I/O or
/// that a holder takes with others: taken with `lock()` and `unlock()` or ``withLock(_:)``.
/// Debug builds check the order on every acquisition.
// @unchecked: pthread_mutex_t is a C type the compiler cannot check; the mutex is its own guard.
package final class OrderedLock: @unchecked Sendable {
    package let rank: LockRank
    package let key: Int
    let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)

    /// - Parameters:
    ///   - rank: where the lock stands in the order.
    ///   - key: for a rank that allows several, the order among them (a document's id).
    package init(_ rank: LockRank, key: Int = 0) {
        self.rank = rank
        self.key = key
        pthread_mutex_init(mutex, nil)
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
    }

    package func lock() {
        #if DEBUG
            LockOrder.willAcquire(rank, key: key)
        #endif
        pthread_mutex_lock(mutex)
        #if DEBUG
            LockOrder.didAcquire(rank, key: key)
        #endif
    }

    package func unlock() {
        #if DEBUG
            LockOrder.didRelease(rank, key: key)
        #endif
        pthread_mutex_unlock(mutex)
    }

    package func withLock<R, E: Error>(_ body: () throws(E) -> R) throws(E) -> R {
        lock()
        defer { unlock() }
        return try body()
    }
}

/// A value guarded by an ``OrderedLock``. Unlike `Mutex`, the body may hand the value to other
/// non-escaping closures, and results need not be `sending`; which the mount's view needs.
package final class Locked<Value> {
    private let lock: OrderedLock
    private var value: Value

    package init(_ rank: LockRank, _ value: Value) {
        lock = OrderedLock(rank)
        self.value = value
    }

    package func withLock<R, E: Error>(_ body: (inout Value) throws(E) -> R) throws(E) -> R {
        lock.lock()
        defer { lock.unlock() }
        return try body(&value)
    }
}

// @unchecked: the lock guards `value`, which may cross threads only when it is Sendable itself.
extension Locked: @unchecked Sendable where Value: Sendable {}
