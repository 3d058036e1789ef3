import DocumentEngine
import GRDB
import StoreSQL
import VersionedStore

/// The lock tables in SQLite, on the writer connection inside a transaction. Times are the
/// machine's wall clock, which every process that opens the store shares.
final class SQLiteLockTransaction: LockTransaction {
    let db: Database
    private(set) var released = false

    init(db: Database) { self.db = db }

    func now() throws -> Int64 { LockClock.wallMilliseconds() }

    func removeExpiredSessions(now: Int64) throws -> Int {
        let expired = try Int64.fetchAll(db.cachedStatement(sql: LockSQL.expiredSessions), arguments: [now])
        for id in expired { try removeSession(LockSessionID(rawValue: id)) }
        if !expired.isEmpty { released = true }
        return expired.count
    }

    func insertSession(label: String, expires: Int64) throws -> LockSessionID {
        guard let id = try Int64.fetchOne(db, sql: LockSQL.insertSession, arguments: [label, expires]) else {
            throw DocumentStoreError.io("a new lock session got no id")
        }
        return LockSessionID(rawValue: id)
    }

    func renewSession(_ id: LockSessionID, expires: Int64, now: Int64) throws -> Bool {
        try Int64.fetchOne(
            db.cachedStatement(sql: LockSQL.renewSession), arguments: [expires, id.rawValue, now])
            != nil
    }

    func removeSession(_ id: LockSessionID) throws {
        try db.execute(sql: LockSQL.removeSession, arguments: [id.rawValue])
        try db.execute(sql: LockSQL.removeSessionWaits, arguments: [id.rawValue])
        _ = try removeLocks(session: id, owner: nil, node: nil)
    }

    func locks(on node: StoreNodeID) throws -> [SharedLock] {
        try Row.fetchAll(db.cachedStatement(sql: LockSQL.locksOnNode), arguments: [node.rawValue]).map {
            row in
            SharedLock(
                node: StoreNodeID(rawValue: row[0]), session: LockSessionID(rawValue: row[1]), owner: row[2],
                kind: SharedLockKind(rawValue: row[3]) ?? .posix, exclusive: (row[4] as Int64) != 0,
                start: row[5],
                last: row[6], pid: Int32(clamping: row[7] as Int64))
        }
    }

    func replaceLocks(
        on node: StoreNodeID, session: LockSessionID, owner: Int64, kind: SharedLockKind,
        with locks: [SharedLock]
    ) throws {
        try db.cachedStatement(sql: LockSQL.removeOwnerKindOnNode).execute(arguments: [
            node.rawValue, session.rawValue, owner, kind.rawValue,
        ])
        let insert = try db.cachedStatement(sql: LockSQL.insertLock)
        for lock in locks {
            try insert.execute(arguments: [
                lock.node.rawValue, lock.session.rawValue, lock.owner, lock.kind.rawValue,
                lock.exclusive ? 1 : 0,
                lock.start, lock.last, Int64(lock.pid),
            ])
        }
    }

    func removeLocks(session: LockSessionID, owner: Int64?, node: StoreNodeID?) throws -> [StoreNodeID] {
        var arguments: [any DatabaseValueConvertible] = [session.rawValue]
        if let owner { arguments.append(owner) }
        if let node { arguments.append(node.rawValue) }
        let nodes = try Int64.fetchAll(
            db, sql: LockSQL.removeLocks(owner: owner != nil, node: node != nil),
            arguments: StatementArguments(arguments))
        return Set(nodes).map(StoreNodeID.init(rawValue:))
    }

    func waits() throws -> [LockWait] {
        try Row.fetchAll(db.cachedStatement(sql: LockSQL.waits)).map { row in
            LockWait(
                session: LockSessionID(rawValue: row[0]), owner: row[1], node: StoreNodeID(rawValue: row[2]),
                exclusive: (row[3] as Int64) != 0, start: row[4], last: row[5])
        }
    }

    func setWait(_ wait: LockWait) throws {
        try removeWait(session: wait.session, owner: wait.owner)
        try db.cachedStatement(sql: LockSQL.insertWait).execute(arguments: [
            wait.session.rawValue, wait.owner, wait.node.rawValue, wait.exclusive ? 1 : 0, wait.start,
            wait.last,
        ])
    }

    func removeWait(session: LockSessionID, owner: Int64) throws {
        try db.cachedStatement(sql: LockSQL.removeWait).execute(arguments: [session.rawValue, owner])
    }

    func notifyLockRelease() throws { released = true }
}
