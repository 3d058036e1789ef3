import DocumentEngine
import FUSE
import Foundation
import Logging
import Synchronization
import SystemPackage
import Threading
import VersionedStore

#if canImport(Glibc)
    import Glibc
#endif

/// File locks (`flock`, POSIX record locks, open file description locks) kept in the store's
/// lock tables, so that every mount of the store sees them, on this machine or another.
///
/// - **Session.** The mount holds its locks under a session with a lease of ``lease``, which
///   every lock operation renews and a heartbeat renews while the mount holds or waits for a
///   lock. A mount that was killed or cut off loses its locks when the lease runs out; one that
///   finds its lease ended makes later I/O on the files it held locks on answer `EIO` until
///   they are opened again, as NFS does after a lost lock.
/// - **Waiting.** A blocked `F_SETLKW` or `flock` is parked, not a thread: it is tried again
///   when the store says a lock was released (LISTEN/NOTIFY on PostgreSQL, a watched file on
///   SQLite), at least every second (a holder whose lease ran out releases nothing), and it
///   answers `EINTR` within a tenth of a second of a signal.
/// - **Fresh data.** Before a lock is released, the document's changes are saved; when one is
///   granted, the document is brought up to the store's version and the kernel's cached pages
///   of the file are dropped. A process that takes a lock sees what others wrote under it.
///
/// Its own state is a leaf lock, never held across a store call or with the view lock.
final class FileLocks: MountRoom {
    let view: MountView
    let saving: SavePipeline
    let reconciler: Reconciler
    /// The store's lock tables, or this mount's own when the store has none.
    let tables: any SharedLockStore
    /// How long locks outlive the mount's last renewal.
    static let lease: Duration = .seconds(6)
    /// How often the heartbeat renews while the mount holds a lock.
    static let heartbeat: Duration = .seconds(2)
    /// How long one renewal may take: a server that does not answer within it (a network cut)
    /// is tried again at once.
    static let renewalLimit: Duration = .milliseconds(1500)
    /// How long before the store could end the lease the mount counts its locks as lost: time
    /// for the loss to reach the files before another mount can be granted their locks.
    static let lostMargin: Duration = .seconds(1)

    private struct Session {
        var id: LockSessionID?
        /// When the last renewal that succeeded was sent: the store's lease ends no earlier
        /// than a lease after it.
        var renewed = ContinuousClock.now
        /// The owners that hold locks, by file.
        var held: [StoreNodeID: Set<Int64>] = [:]
        var waiters: [ObjectIdentifier: LockWaiter] = [:]
        var heartbeatRunning = false
        var waiterLoopRunning = false
        var stopping = false
    }
    private let session = Mutex(Session())
    private let origin: String

    init(view: MountView, saving: SavePipeline, reconciler: Reconciler) {
        self.view = view
        self.saving = saving
        self.reconciler = reconciler
        tables = view.store.sharedLocks ?? MemoryStore(location: "locks").versionedStore
        var host = [CChar](repeating: 0, count: 256)
        gethostname(&host, host.count - 1)
        let name = String(decoding: host.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        origin = "\(name) pid \(getpid())"
    }

    // MARK: Requests

    /// Takes a lock for `file` through `handle`; with `wait`, parks `reply` until it is granted.
    func acquire(
        _ file: ViewNode, handle: UInt64, owner: Int64, kind: SharedLockKind, exclusive: Bool, start: Int64,
        last: Int64, pid: Int32, wait: Bool, reply: consuming ReplyEmpty
    ) {
        let node = Self.key(file)
        var lock = SharedLock(
            node: node, session: LockSessionID(rawValue: 0), owner: owner, kind: kind, exclusive: exclusive,
            start: start, last: last, pid: pid)
        let answer: SharedLockAnswer
        do throws(Errno) {
            answer = try attempt(&lock, waiting: wait)
        } catch {
            reply.error(error)
            return
        }
        switch answer {
        case .granted:
            granted(lock, handle: handle)
            reply.ok()
        case .blocked:
            guard wait else {
                reply.error(.resourceTemporarilyUnavailable)
                return
            }
            park(LockWaiter(lock: lock, handle: handle, reply: reply))
        case .deadlock:
            reply.error(.deadlock)
        case .sessionLost:
            reply.error(.noLocks)
        }
    }

    /// Releases `start...last` of the owner's locks of `kind` on `file`, once the document's
    /// changes are in the store.
    func release(_ file: ViewNode, owner: Int64, kind: SharedLockKind, start: Int64, last: Int64)
        throws(Errno)
    {
        let node = Self.key(file)
        guard let id = session.withLock({ $0.held[node]?.contains(owner) == true ? $0.id : nil }) else {
            return
        }
        saveBeforeRelease(file)
        try storeCall {
            try tables.releaseLock(
                node: node, session: id, owner: owner, kind: kind, start: start, last: last)
        }
        // Whether anything is left is the store's to say; a later release finds nothing.
    }

    /// Releases every lock `owner` holds on `file` (a close: the owner's POSIX locks go with
    /// any of its descriptors of the file; a release: the open's own locks).
    func releaseAll(_ file: ViewNode, owners: Set<Int64>) throws(Errno) {
        let node = Self.key(file)
        let (id, mine) = session.withLock { session -> (LockSessionID?, Set<Int64>) in
            (session.id, session.held[node]?.intersection(owners) ?? [])
        }
        guard let id, !mine.isEmpty else { return }
        saveBeforeRelease(file)
        for owner in mine {
            _ = try storeCall { try tables.releaseLocks(session: id, owner: owner, node: node) }
        }
        session.withLock { session in
            session.held[node]?.subtract(mine)
            if session.held[node]?.isEmpty == true { session.held[node] = nil }
        }
    }

    /// Whether this mount holds a lock on `file`.
    func holdsLocks(on file: ViewNode) -> Bool {
        let key = state.withLock { _ in Self.key(file) }
        return session.withLock { $0.held[key] != nil }
    }

    /// The lock of another owner that conflicts with this one, for `F_GETLK`; its pid is 0 when
    /// it belongs to another mount, whose process ids mean nothing here.
    func conflicting(
        _ file: ViewNode, owner: Int64, exclusive: Bool, start: Int64, last: Int64
    ) throws(Errno) -> SharedLock? {
        let id = try currentSession()
        let probe = SharedLock(
            node: Self.key(file), session: id, owner: owner, kind: .posix, exclusive: exclusive, start: start,
            last: last, pid: 0)
        guard var found = try storeCall({ try tables.conflictingLock(probe) }) else { return nil }
        if found.session != id { found.pid = 0 }
        return found
    }

    /// Ends the session at unmount: its locks go at once rather than when the lease runs out.
    func stop() {
        let (id, waiters) = session.withLock { session -> (LockSessionID?, [LockWaiter]) in
            session.stopping = true
            defer {
                session.id = nil
                session.held = [:]
                session.waiters = [:]
            }
            return (session.id, Array(session.waiters.values))
        }
        for waiter in waiters { waiter.answer(.noLocks) }
        if let id { try? tables.closeLockSession(id) }
    }

    // MARK: Granting

    /// Tries `lock` under the current session, opening one (or a new one, once, after the old
    /// one's lease ran out while it held nothing) as needed.
    private func attempt(_ lock: inout SharedLock, waiting: Bool) throws(Errno) -> SharedLockAnswer {
        for _ in 0..<2 {
            lock.session = try currentSession()
            let request = lock
            let sent = ContinuousClock.now
            let answer = try storeCall {
                try tables.acquireLock(request, waiting: waiting, lease: Self.lease)
            }
            guard answer == .sessionLost else {
                // The store renewed the lease when it took the request, which was after it was sent.
                session.withLock { if $0.id == request.session { $0.renewed = max($0.renewed, sent) } }
                return answer
            }
            sessionLost(request.session)
        }
        return .sessionLost
    }

    /// The session's id, opened if there is none.
    private func currentSession() throws(Errno) -> LockSessionID {
        if let id = session.withLock({ $0.id }) { return id }
        let sent = ContinuousClock.now
        let opened = try storeCall { try tables.openLockSession(label: origin, lease: Self.lease) }
        let (id, extra) = session.withLock { session -> (LockSessionID, LockSessionID?) in
            if let id = session.id { return (id, opened) }
            session.id = opened
            session.renewed = sent
            return (opened, nil)
        }
        if let extra { try? tables.closeLockSession(extra) }
        return id
    }

    /// Records the owner's lock, brings the file up to date and has the kernel drop its pages.
    private func granted(_ lock: SharedLock, handle: UInt64) {
        session.withLock { session in
            _ = session.held[lock.node, default: []].insert(lock.owner)
        }
        state.withLock { state in _ = state.files[handle]?.lockOwners.insert(lock.owner) }
        startHeartbeat()
        freshen(handle: handle)
    }

    /// Lock-to-read: the document as the store has it now, read through every open of the file.
    private func freshen(handle: UInt64) {
        guard let file = state.withLock({ $0.files[handle]?.node }) else { return }
        guard
            let (document, before) = state.withLock({ state in
                self.document(&state, of: file).map { ($0, $0.base) }
            })
        else { return }
        do { try reconciler.revalidate(file) } catch {
            logger.warning("cannot bring \(file.name.string) up to date for its lock: \(error)")
            return
        }
        // A reload the observer is in the middle of has queued what the kernel must forget once
        // it lets this lock go.
        document.saving.lock()
        document.saving.unlock()
        // Every open of the file reads what the store has now, whichever reload brought it.
        let changed = state.withLock { state -> Bool in
            if let contents = (file.linkOf ?? file).contents {
                for (key, open) in state.files where open.node === file || open.node === file.linkOf {
                    state.files[key]?.generation = contents.generation
                    state.files[key]?.snapshot = contents.isModified ? nil : contents.base
                }
            }
            return document.base != before
        }
        // A granted lock is answered once the kernel has forgotten what changed (the notices go
        // in order, so this last one waits for a reload's too): it holds none of the file's locks
        // for a lock request. The file's pages go only when it changed. The wait is long: a
        // reply before the kernel dropped its pages would let the holder read old bytes, which
        // on a loaded machine took more than a second.
        let ino = (file.linkOf ?? file).ino
        send([changed ? .inode(ino) : .attributes(ino)], waitingUpTo: .seconds(10), again: false)
    }

    /// A release's changes must be in the store first: whoever takes the lock next reads them.
    /// A save that fails does not keep the lock: its error is the next close's or fsync's, as
    /// for any save, and the changes stay pending.
    private func saveBeforeRelease(_ file: ViewNode) {
        guard let document = state.withLock({ state in self.document(&state, of: file) }) else { return }
        do throws(Errno) { try saving.save(document, durable: false) } catch {
            logger.warning("saving \(document.info.name) before releasing a lock failed: \(error)")
        }
    }

    // MARK: Waiting

    private func park(_ waiter: LockWaiter) {
        let start = session.withLock { session -> Bool in
            guard !session.stopping else { return false }
            session.waiters[ObjectIdentifier(waiter)] = waiter
            defer { session.waiterLoopRunning = true }
            return !session.waiterLoopRunning
        }
        guard !session.withLock({ $0.stopping }) else {
            waiter.answer(.noLocks)
            return
        }
        startHeartbeat()
        if start {
            let launched = startDetachedThread(name: "docfs.lock-waits") { [self] in waitLoop() }
            if !launched {
                session.withLock { $0.waiterLoopRunning = false }
                waiter.answer(.noLocks)
            }
        }
    }

    /// Tries the parked requests again whenever a lock may have been released, until none is left.
    private func waitLoop() {
        var generation = tables.lockGeneration
        var lastTry = ContinuousClock.now
        var retry = true
        while true {
            let waiters = session.withLock { session -> [LockWaiter]? in
                if session.waiters.isEmpty {
                    session.waiterLoopRunning = false
                    return nil
                }
                return Array(session.waiters.values)
            }
            guard let waiters else { return }
            for waiter in waiters where waiter.isInterrupted {
                forget(waiter)
                try? tables.cancelLockWait(session: waiter.lock.session, owner: waiter.lock.owner)
                waiter.answer(.interrupted)
            }
            if retry || ContinuousClock.now - lastTry >= .seconds(1) {
                lastTry = .now
                for waiter in waiters where !waiter.isInterrupted { tryAgain(waiter) }
            }
            let seen = tables.waitForLockRelease(after: generation, timeout: .milliseconds(100))
            retry = seen != generation
            generation = seen
        }
    }

    private func tryAgain(_ waiter: LockWaiter) {
        var lock = waiter.lock
        let answer: SharedLockAnswer
        do throws(Errno) {
            answer = try attempt(&lock, waiting: true)
        } catch {
            forget(waiter)
            waiter.answer(error)
            return
        }
        switch answer {
        case .blocked:
            return
        case .granted:
            forget(waiter)
            granted(lock, handle: waiter.handle)
            waiter.answer(nil)
        case .deadlock:
            forget(waiter)
            waiter.answer(.deadlock)
        case .sessionLost:
            forget(waiter)
            waiter.answer(.noLocks)
        }
    }

    private func forget(_ waiter: LockWaiter) {
        session.withLock { _ = $0.waiters.removeValue(forKey: ObjectIdentifier(waiter)) }
    }

    // MARK: The lease

    private func startHeartbeat() {
        let start = session.withLock { session -> Bool in
            guard !session.heartbeatRunning, !session.stopping else { return false }
            session.heartbeatRunning = true
            return true
        }
        guard start else { return }
        let launched = startDetachedThread(name: "docfs.lock-lease") { [self] in heartbeatLoop() }
        if !launched { session.withLock { $0.heartbeatRunning = false } }
    }

    /// Renews the lease while the mount holds or waits for a lock. A renewal that cannot reach
    /// the store is tried again every quarter second, each one given only the time left before
    /// ``lostMargin`` ahead of the lease's end: once that is reached the locks are counted as
    /// lost, before the store can give them to anyone else (its lease ends no earlier than a
    /// lease after the last renewal that succeeded was sent).
    private func heartbeatLoop() {
        while true {
            let (id, renewed, busy) = session.withLock {
                session -> (LockSessionID?, ContinuousClock.Instant, Bool) in
                let busy =
                    !session.stopping && session.id != nil
                    && (!session.held.isEmpty || !session.waiters.isEmpty)
                if !busy { session.heartbeatRunning = false }
                return (session.id, session.renewed, busy)
            }
            guard busy, let id else { return }
            let sent = ContinuousClock.now
            let left = renewed + Self.lease - Self.lostMargin - sent
            if left <= .zero {
                logger.warning("the lease of \(id) ran out: its locks are lost")
                sessionLost(id)
                continue
            }
            let wait: Duration
            do {
                if try tables.renewLockSession(id, lease: Self.lease, timeout: min(left, Self.renewalLimit)) {
                    session.withLock { if $0.id == id { $0.renewed = max($0.renewed, sent) } }
                    wait = Self.heartbeat
                } else {
                    logger.warning("the store ended the lease of \(id): its locks are lost")
                    sessionLost(id)
                    continue
                }
            } catch {
                logger.warning("cannot renew the lease of \(id): \(error)")
                wait = .milliseconds(250)
            }
            Thread.sleep(
                forTimeInterval: Double(wait.components.seconds) + Double(wait.components.attoseconds) / 1e18)
        }
    }

    /// The session's locks are gone: opens that held some fail their I/O, and waiters are told.
    private func sessionLost(_ id: LockSessionID) {
        let (nodes, waiters) = session.withLock { session -> ([StoreNodeID], [LockWaiter]) in
            guard session.id == id else { return ([], []) }
            session.id = nil
            defer {
                session.held = [:]
                session.waiters = [:]
            }
            return (Array(session.held.keys), Array(session.waiters.values))
        }
        for waiter in waiters { waiter.answer(.noLocks) }
        guard !nodes.isEmpty else { return }
        let lost = Set(nodes)
        let files = state.withLock { state -> Set<UInt64> in
            var files: Set<UInt64> = []
            for (key, open) in state.files
            where !open.lockOwners.isEmpty && lost.contains(Self.key(open.node)) {
                state.files[key]?.lockLost = true
                state.files[key]?.lockOwners = []
                files.insert((open.node.linkOf ?? open.node).ino)
            }
            return files
        }
        // Reads the kernel would answer from its cache come here instead, and fail.
        send(files.map { .inode($0) })
    }

    /// The file's identity in the store, which every mount shares.
    static func key(_ file: ViewNode) -> StoreNodeID { (file.linkOf ?? file).persistAs }
}

/// A parked lock request and its reply, answered once.
final class LockWaiter: Sendable {
    let lock: SharedLock
    let handle: UInt64
    private let reply: Mutex<ReplyEmpty?>

    init(lock: SharedLock, handle: UInt64, reply: consuming ReplyEmpty) {
        self.lock = lock
        self.handle = handle
        self.reply = Mutex(Optional(reply))
    }

    var isInterrupted: Bool { reply.withLock { $0?.isInterrupted ?? false } }

    /// Answers the request: success with nil.
    func answer(_ error: Errno?) {
        guard let taken = reply.withLock({ $0.take() }) else { return }
        if let error { taken.error(error) } else { taken.ok() }
    }
}
