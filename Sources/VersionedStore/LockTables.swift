import DocumentEngine
import Foundation
import Threading

/// The lock tables as plain values, for a store in memory (``MemoryStore``): one process, so its
/// clock is the wall clock and its news of a release is a ``LockBell``.
struct LockTables: Sendable {
    var sessions: [LockSessionID: (label: String, expires: Int64)] = [:]
    var nextSession: Int64 = 1
    var locks: [StoreNodeID: [SharedLock]] = [:]
    var waits: [LockWait] = []
}

/// One transaction over a copy of ``LockTables``, published when it succeeds.
final class LockTablesTransaction: LockTransaction {
    var tables: LockTables
    private(set) var released = false

    init(_ tables: LockTables) { self.tables = tables }

    func now() throws -> Int64 { LockClock.wallMilliseconds() }

    func removeExpiredSessions(now: Int64) throws -> Int {
        let expired = tables.sessions.filter { $0.value.expires < now }.map(\.key)
        for id in expired { try removeSession(id) }
        if !expired.isEmpty { released = true }
        return expired.count
    }

    func insertSession(label: String, expires: Int64) throws -> LockSessionID {
        let id = LockSessionID(rawValue: tables.nextSession)
        tables.nextSession += 1
        tables.sessions[id] = (label, expires)
        return id
    }

    func renewSession(_ id: LockSessionID, expires: Int64, now: Int64) throws -> Bool {
        guard let session = tables.sessions[id], session.expires >= now else { return false }
        tables.sessions[id] = (session.label, expires)
        return true
    }

    func removeSession(_ id: LockSessionID) throws {
        tables.sessions[id] = nil
        _ = try removeLocks(session: id, owner: nil, node: nil)
        tables.waits.removeAll { $0.session == id }
    }

    func locks(on node: StoreNodeID) throws -> [SharedLock] { tables.locks[node] ?? [] }

    func replaceLocks(
        on node: StoreNodeID, session: LockSessionID, owner: Int64, kind: SharedLockKind,
        with locks: [SharedLock]
    ) throws {
        var all = tables.locks[node] ?? []
        all.removeAll { $0.session == session && $0.owner == owner && $0.kind == kind }
        all += locks
        tables.locks[node] = all.isEmpty ? nil : all
    }

    func removeLocks(session: LockSessionID, owner: Int64?, node: StoreNodeID?) throws -> [StoreNodeID] {
        var touched: [StoreNodeID] = []
        for key in node.map({ [$0] }) ?? Array(tables.locks.keys) {
            guard var all = tables.locks[key] else { continue }
            let before = all.count
            all.removeAll { $0.session == session && (owner == nil || $0.owner == owner) }
            if all.count != before { touched.append(key) }
            tables.locks[key] = all.isEmpty ? nil : all
        }
        return touched
    }

    func waits() throws -> [LockWait] { tables.waits }

    func setWait(_ wait: LockWait) throws {
        tables.waits.removeAll { $0.session == wait.session && $0.owner == wait.owner }
        tables.waits.append(wait)
    }

    func removeWait(session: LockSessionID, owner: Int64) throws {
        tables.waits.removeAll { $0.session == session && $0.owner == owner }
    }

    func notifyLockRelease() throws { released = true }
}

/// News that a lock may have been released: a counter that waiters wait on.
package final class LockBell: Sendable {
    private let generation = Monitor<UInt64>(0)

    package init() {}

    package var current: UInt64 { generation.withLock(wake: false) { $0 } }

    package func ring() { generation.withLock { $0 &+= 1 } }

    package func wait(after seen: UInt64, timeout: Duration) -> UInt64 {
        _ = generation.wait(until: { $0 > seen }, timeout: timeout, then: { _ in () })
        return current
    }
}

/// The clock of a store without a server: lease times are judged by the machine's wall clock,
/// which every process that opens the store's file shares.
package enum LockClock {
    package static func wallMilliseconds() -> Int64 {
        Int64((Date().timeIntervalSince1970 * 1000).rounded(.down))
    }
}
