import DocumentEngine

/// File locks that every mount of the store sees: the lock tables' part of the store algorithm.
/// Each operation is one short transaction (``StoreBackend/lockTransaction(timeout:_:)``), which never
/// waits for a save.
///
/// A mount holds its locks under a session with a lease. Every operation of the session renews
/// it, and a mount holding locks renews it on its own between operations; a session whose lease
/// ran out is deleted with its locks by the next operation of any mount, so a mount that was
/// killed or cut off loses its locks within the lease.
extension VersionedStore {
    /// How deep the deadlock check follows owners waiting for owners (as Linux's own check).
    static let deadlockDepth = 16

    /// Starts a session whose locks live `lease` past each renewal.
    public func openLockSession(label: String, lease: Duration) throws -> LockSessionID {
        try backend.lockTransaction(timeout: nil) { tx in
            let now = try tx.now()
            try tx.removeExpiredSessions(now: now)
            return try tx.insertSession(label: label, expires: now + Self.milliseconds(lease))
        }
    }

    /// Extends the session's lease; false when it had run out (its locks are gone). A store that
    /// does not answer within `timeout` fails it, so that the caller can count the lease itself.
    public func renewLockSession(_ session: LockSessionID, lease: Duration, timeout: Duration) throws -> Bool
    {
        try backend.lockTransaction(timeout: timeout) { tx in
            let now = try tx.now()
            return try tx.renewSession(session, expires: now + Self.milliseconds(lease), now: now)
        }
    }

    /// Ends the session and releases its locks.
    public func closeLockSession(_ session: LockSessionID) throws {
        try backend.lockTransaction(timeout: nil) { tx in
            try tx.removeSession(session)
            try tx.notifyLockRelease()
        }
    }

    /// Takes `lock` (a flock's range is the whole file), replacing what its owner held in its
    /// range; or says who holds it. With `waiting`, a blocked POSIX request is checked for a
    /// deadlock and recorded as waiting.
    public func acquireLock(_ lock: SharedLock, waiting: Bool, lease: Duration) throws -> SharedLockAnswer {
        try backend.lockTransaction(timeout: nil) { tx in
            let now = try tx.now()
            try tx.removeExpiredSessions(now: now)
            guard try tx.renewSession(lock.session, expires: now + Self.milliseconds(lease), now: now) else {
                return .sessionLost
            }
            let held = try tx.locks(on: lock.node)
            if let holder = held.first(where: { lock.conflicts(with: $0) }) {
                if waiting && lock.kind == .posix {
                    if try Self.closesCycle(lock, blockedBy: held, in: tx) { return .deadlock }
                    try tx.setWait(
                        LockWait(
                            session: lock.session, owner: lock.owner, node: lock.node,
                            exclusive: lock.exclusive,
                            start: lock.start, last: lock.last))
                }
                return .blocked(by: holder)
            }
            let own = held.filter { lock.sameOwner($0) }
            let updated: [SharedLock]
            if lock.kind == .flock {
                updated = [lock]
            } else {
                updated = LockRanges.apply(
                    own, start: lock.start, last: lock.last, exclusive: lock.exclusive, as: lock)
            }
            if updated != own {
                try tx.replaceLocks(
                    on: lock.node, session: lock.session, owner: lock.owner, kind: lock.kind, with: updated)
                if LockRanges.releases(own, updated) { try tx.notifyLockRelease() }
            }
            if waiting && lock.kind == .posix { try tx.removeWait(session: lock.session, owner: lock.owner) }
            return .granted
        }
    }

    /// Releases `start...last` of what the owner holds of `kind` on `node` (a flock: all of it).
    public func releaseLock(
        node: StoreNodeID, session: LockSessionID, owner: Int64, kind: SharedLockKind, start: Int64,
        last: Int64
    ) throws {
        try backend.lockTransaction(timeout: nil) { tx in
            let own = try tx.locks(on: node).filter {
                $0.session == session && $0.owner == owner && $0.kind == kind
            }
            guard !own.isEmpty else { return }
            let updated =
                kind == .flock
                ? [] : LockRanges.apply(own, start: start, last: last, exclusive: nil, as: own[0])
            guard updated != own else { return }
            try tx.replaceLocks(on: node, session: session, owner: owner, kind: kind, with: updated)
            try tx.notifyLockRelease()
        }
    }

    /// Releases every lock of `owner` (of every owner when nil) of the session, on `node` or
    /// everywhere; returns the nodes that had some.
    @discardableResult
    public func releaseLocks(session: LockSessionID, owner: Int64?, node: StoreNodeID?) throws
        -> [StoreNodeID]
    {
        try backend.lockTransaction(timeout: nil) { tx in
            let nodes = try tx.removeLocks(session: session, owner: owner, node: node)
            if !nodes.isEmpty { try tx.notifyLockRelease() }
            return nodes
        }
    }

    /// Forgets that the owner waits (its request was granted elsewhere, interrupted or dropped).
    public func cancelLockWait(session: LockSessionID, owner: Int64) throws {
        try backend.lockTransaction(timeout: nil) { tx in try tx.removeWait(session: session, owner: owner) }
    }

    /// The first lock of another owner that keeps `lock` from being granted (`F_GETLK`).
    public func conflictingLock(_ lock: SharedLock) throws -> SharedLock? {
        try backend.lockTransaction(timeout: nil) { tx in
            let now = try tx.now()
            try tx.removeExpiredSessions(now: now)
            return try tx.locks(on: lock.node).first { lock.conflicts(with: $0) }
        }
    }

    /// Grows whenever a mount may have released a lock (and whenever its notifications may have
    /// been missed): a waiter tries again then.
    public var lockGeneration: UInt64 { backend.lockGeneration }

    /// Blocks until ``lockGeneration`` exceeds `generation` or `timeout` passes.
    public func waitForLockRelease(after generation: UInt64, timeout: Duration) -> UInt64 {
        backend.waitForLockRelease(after: generation, timeout: timeout)
    }

    /// Whether `lock`, blocked by `held`, waits (through owners that wait in turn) for its own
    /// owner.
    private static func closesCycle(
        _ lock: SharedLock, blockedBy held: [SharedLock], in tx: any LockTransaction
    )
        throws -> Bool
    {
        let waits = try tx.waits()
        guard !waits.isEmpty else { return false }
        struct Owner: Hashable {
            var session: LockSessionID
            var owner: Int64
        }
        let me = Owner(session: lock.session, owner: lock.owner)
        var frontier = Set(
            held.filter { lock.conflicts(with: $0) }.map { Owner(session: $0.session, owner: $0.owner) })
        var seen: Set<Owner> = []
        var locksByNode: [StoreNodeID: [SharedLock]] = [lock.node: held]
        for _ in 0..<deadlockDepth {
            var next: Set<Owner> = []
            for holder in frontier where seen.insert(holder).inserted {
                if holder == me { return true }
                guard
                    let wait = waits.first(where: { $0.session == holder.session && $0.owner == holder.owner }
                    )
                else { continue }
                let wanted = SharedLock(
                    node: wait.node, session: wait.session, owner: wait.owner, kind: .posix,
                    exclusive: wait.exclusive,
                    start: wait.start, last: wait.last, pid: 0)
                if locksByNode[wait.node] == nil { locksByNode[wait.node] = try tx.locks(on: wait.node) }
                for other in locksByNode[wait.node] ?? [] where wanted.conflicts(with: other) {
                    next.insert(Owner(session: other.session, owner: other.owner))
                }
            }
            if next.contains(me) { return true }
            guard !next.isEmpty else { return false }
            frontier = next
        }
        return false
    }

    static func milliseconds(_ duration: Duration) -> Int64 {
        let (seconds, attoseconds) = duration.components
        return seconds * 1000 + attoseconds / 1_000_000_000_000_000
    }
}
