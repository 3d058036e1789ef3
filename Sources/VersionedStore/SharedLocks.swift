import DocumentEngine

/// A mount's session in the store's lock tables: the locks it holds are kept while it renews its
/// lease, and every other mount ignores them (and the first to look deletes them) once the lease
/// has run out.
public struct LockSessionID: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: Int64
    public init(rawValue: Int64) { self.rawValue = rawValue }
    public var description: String { "lock session \(rawValue)" }
}

/// The two families of file locks, which Linux keeps apart: a `flock(2)` lock never conflicts
/// with a POSIX record lock (`fcntl`, including open file description locks), and the other way
/// round.
public enum SharedLockKind: Int64, Hashable, Sendable {
    case posix = 0
    case flock = 1
}

/// One lock as the store keeps it: a byte range of a file (`start...last`, `Int64.max` for "to
/// the end, however far") held shared or exclusive by an owner of a session.
public struct SharedLock: Hashable, Sendable {
    public var node: StoreNodeID
    public var session: LockSessionID
    /// The kernel's lock owner, unique within the session's mount.
    public var owner: Int64
    public var kind: SharedLockKind
    public var exclusive: Bool
    public var start: Int64
    public var last: Int64
    /// The process that took it, on its session's machine.
    public var pid: Int32

    public init(
        node: StoreNodeID, session: LockSessionID, owner: Int64, kind: SharedLockKind, exclusive: Bool,
        start: Int64, last: Int64, pid: Int32
    ) {
        self.node = node
        self.session = session
        self.owner = owner
        self.kind = kind
        self.exclusive = exclusive
        self.start = start
        self.last = last
        self.pid = pid
    }

    /// Whether `other` (held by someone else, of the same kind) keeps this one from being granted.
    func conflicts(with other: SharedLock) -> Bool {
        guard other.kind == kind, other.session != session || other.owner != owner else { return false }
        guard exclusive || other.exclusive else { return false }
        return start <= other.last && other.start <= last
    }

    func sameOwner(_ other: SharedLock) -> Bool {
        other.session == session && other.owner == owner && other.kind == kind
    }
}

/// What a lock request came to.
public enum SharedLockAnswer: Hashable, Sendable {
    case granted
    /// Held by another owner; a waiting request is recorded as waiting for it.
    case blocked(by: SharedLock)
    /// Waiting would close a cycle of POSIX owners waiting for each other.
    case deadlock
    /// The session's lease ran out (or it never was): its locks are gone.
    case sessionLost
}

/// POSIX's rules for one owner's record locks: a new lock replaces whatever the owner held in its
/// range (so it splits, shrinks or converts them), an unlock removes the range, and locks of one
/// type that touch merge.
enum LockRanges {
    /// The owner's locks after `request` (`exclusive` nil: an unlock of the range).
    static func apply(
        _ held: [SharedLock], start: Int64, last: Int64, exclusive: Bool?, as template: SharedLock
    )
        -> [SharedLock]
    {
        var result: [SharedLock] = []
        for lock in held {
            guard lock.start <= last && start <= lock.last else {
                result.append(lock)
                continue
            }
            if lock.start < start {
                var before = lock
                before.last = start - 1
                result.append(before)
            }
            if lock.last > last {
                var after = lock
                after.start = last + 1
                result.append(after)
            }
        }
        if let exclusive {
            var added = template
            added.start = start
            added.last = last
            added.exclusive = exclusive
            result.append(added)
        }
        result.sort { $0.start < $1.start }
        var merged: [SharedLock] = []
        for lock in result {
            if var previous = merged.last, previous.exclusive == lock.exclusive,
                previous.last == .max || previous.last + 1 >= lock.start
            {
                previous.last = max(previous.last, lock.last)
                previous.pid = lock.pid
                merged[merged.count - 1] = previous
            } else {
                merged.append(lock)
            }
        }
        return merged
    }

    /// Whether every byte `before` held is still held at least as strongly in `after`: if not,
    /// the change released something another owner may be waiting for.
    static func releases(_ before: [SharedLock], _ after: [SharedLock]) -> Bool {
        for old in before {
            var at = old.start
            while true {
                guard
                    let cover = after.first(where: {
                        $0.start <= at && at <= $0.last && ($0.exclusive || !old.exclusive)
                    })
                else { return true }
                if cover.last >= old.last { break }
                at = cover.last + 1
            }
        }
        return false
    }
}

/// A request that waits (`F_SETLKW`, a blocking `flock`): what it waits for, so that another
/// owner's request can see a cycle of waits.
package struct LockWait: Hashable, Sendable {
    package var session: LockSessionID
    package var owner: Int64
    package var node: StoreNodeID
    package var exclusive: Bool
    package var start: Int64
    package var last: Int64

    package init(
        session: LockSessionID, owner: Int64, node: StoreNodeID, exclusive: Bool, start: Int64, last: Int64
    ) {
        self.session = session
        self.owner = owner
        self.node = node
        self.exclusive = exclusive
        self.start = start
        self.last = last
    }
}

/// One short transaction over the store's lock tables. Times are milliseconds of the store's
/// own clock (the database server's, where there is one), so that every mount judges a lease by
/// the same clock.
package protocol LockTransaction {
    func now() throws -> Int64
    /// Deletes the sessions whose lease ended before `now`, with their locks and waits; returns
    /// how many.
    @discardableResult func removeExpiredSessions(now: Int64) throws -> Int
    func insertSession(label: String, expires: Int64) throws -> LockSessionID
    /// Extends a live session's lease; false when it has none (it ran out, or never was).
    func renewSession(_ id: LockSessionID, expires: Int64, now: Int64) throws -> Bool
    /// Deletes a session with its locks and waits.
    func removeSession(_ id: LockSessionID) throws
    /// The locks of both kinds on `node`.
    func locks(on node: StoreNodeID) throws -> [SharedLock]
    /// Replaces what `owner` of `session` holds of `kind` on `node` with `locks`.
    func replaceLocks(
        on node: StoreNodeID, session: LockSessionID, owner: Int64, kind: SharedLockKind,
        with locks: [SharedLock])
        throws
    /// Removes an owner's locks of both kinds (every owner of the session when nil), on `node`
    /// only or everywhere; returns the nodes that had some.
    func removeLocks(session: LockSessionID, owner: Int64?, node: StoreNodeID?) throws -> [StoreNodeID]
    /// The waits of POSIX requests, for the deadlock check.
    func waits() throws -> [LockWait]
    func setWait(_ wait: LockWait) throws
    func removeWait(session: LockSessionID, owner: Int64) throws
    /// Tells the other mounts, at commit, that locks were released.
    func notifyLockRelease() throws
}

/// The lock tables of a store, as a mount uses them (``VersionedStore``'s lock operations).
public protocol SharedLockStore: Sendable {
    func openLockSession(label: String, lease: Duration) throws -> LockSessionID
    func renewLockSession(_ session: LockSessionID, lease: Duration, timeout: Duration) throws -> Bool
    func closeLockSession(_ session: LockSessionID) throws
    func acquireLock(_ lock: SharedLock, waiting: Bool, lease: Duration) throws -> SharedLockAnswer
    func releaseLock(
        node: StoreNodeID, session: LockSessionID, owner: Int64, kind: SharedLockKind, start: Int64,
        last: Int64)
        throws
    @discardableResult
    func releaseLocks(session: LockSessionID, owner: Int64?, node: StoreNodeID?) throws -> [StoreNodeID]
    func cancelLockWait(session: LockSessionID, owner: Int64) throws
    func conflictingLock(_ lock: SharedLock) throws -> SharedLock?
    var lockGeneration: UInt64 { get }
    func waitForLockRelease(after generation: UInt64, timeout: Duration) -> UInt64
}

extension VersionedStore: SharedLockStore {}
