import DocumentEngine
import StoreSQL
import VersionedStore

/// The lock tables in PostgreSQL, in one transaction. Times are the server's clock, which every
/// mount of the store shares whatever its own machine's clock says.
struct PostgresLockTransaction: LockTransaction {
    let db: SQLConnection

    /// `LockSQL`'s `?` placeholders as PostgreSQL's numbered ones.
    private static func numbered(_ sql: String) -> String {
        var result = ""
        var index = 0
        for character in sql {
            if character == "?" {
                index += 1
                result += "$\(index)"
            } else {
                result.append(character)
            }
        }
        return result
    }

    private func query(_ sql: String, _ values: [SQLValue] = []) throws -> [SQLRow] {
        try db.query(Self.numbered(sql), values)
    }

    func now() throws -> Int64 {
        guard let now = try db.scalar("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint") else {
            throw DocumentStoreError.io("the server gave no time")
        }
        return now
    }

    func removeExpiredSessions(now: Int64) throws -> Int {
        let expired = try query(LockSQL.expiredSessions, [.int(now)]).map { try $0.int("id") }
        for id in expired { try removeSession(LockSessionID(rawValue: id)) }
        if !expired.isEmpty { try notifyLockRelease() }
        return expired.count
    }

    func insertSession(label: String, expires: Int64) throws -> LockSessionID {
        guard let row = try query(LockSQL.insertSession, [.text(label), .int(expires)]).first else {
            throw DocumentStoreError.io("a new lock session got no id")
        }
        return LockSessionID(rawValue: try row.int("id"))
    }

    func renewSession(_ id: LockSessionID, expires: Int64, now: Int64) throws -> Bool {
        try !query(LockSQL.renewSession, [.int(expires), .int(id.rawValue), .int(now)]).isEmpty
    }

    func removeSession(_ id: LockSessionID) throws {
        _ = try query(LockSQL.removeSession, [.int(id.rawValue)])
        _ = try query(LockSQL.removeSessionWaits, [.int(id.rawValue)])
        _ = try removeLocks(session: id, owner: nil, node: nil)
    }

    func locks(on node: StoreNodeID) throws -> [SharedLock] {
        try query(LockSQL.locksOnNode, [.int(node.rawValue)]).map { row in
            SharedLock(
                node: StoreNodeID(rawValue: try row.int("node")),
                session: LockSessionID(rawValue: try row.int("session")),
                owner: try row.int("owner"), kind: SharedLockKind(rawValue: try row.int("kind")) ?? .posix,
                exclusive: try row.int("exclusive") != 0, start: try row.int("start"),
                last: try row.int("last"),
                pid: Int32(clamping: try row.int("pid")))
        }
    }

    func replaceLocks(
        on node: StoreNodeID, session: LockSessionID, owner: Int64, kind: SharedLockKind,
        with locks: [SharedLock]
    ) throws {
        _ = try query(
            LockSQL.removeOwnerKindOnNode,
            [.int(node.rawValue), .int(session.rawValue), .int(owner), .int(kind.rawValue)])
        for lock in locks {
            _ = try query(
                LockSQL.insertLock,
                [
                    .int(lock.node.rawValue), .int(lock.session.rawValue), .int(lock.owner),
                    .int(lock.kind.rawValue),
                    .int(lock.exclusive ? 1 : 0), .int(lock.start), .int(lock.last), .int(Int64(lock.pid)),
                ])
        }
    }

    func removeLocks(session: LockSessionID, owner: Int64?, node: StoreNodeID?) throws -> [StoreNodeID] {
        var values: [SQLValue] = [.int(session.rawValue)]
        if let owner { values.append(.int(owner)) }
        if let node { values.append(.int(node.rawValue)) }
        let rows = try query(LockSQL.removeLocks(owner: owner != nil, node: node != nil), values)
        return Set(try rows.map { try $0.int("node") }).map(StoreNodeID.init(rawValue:))
    }

    func waits() throws -> [LockWait] {
        try query(LockSQL.waits).map { row in
            LockWait(
                session: LockSessionID(rawValue: try row.int("session")), owner: try row.int("owner"),
                node: StoreNodeID(rawValue: try row.int("node")), exclusive: try row.int("exclusive") != 0,
                start: try row.int("start"), last: try row.int("last"))
        }
    }

    func setWait(_ wait: LockWait) throws {
        try removeWait(session: wait.session, owner: wait.owner)
        _ = try query(
            LockSQL.insertWait,
            [
                .int(wait.session.rawValue), .int(wait.owner), .int(wait.node.rawValue),
                .int(wait.exclusive ? 1 : 0),
                .int(wait.start), .int(wait.last),
            ])
    }

    func removeWait(session: LockSessionID, owner: Int64) throws {
        _ = try query(LockSQL.removeWait, [.int(session.rawValue), .int(owner)])
    }

    /// NOTIFY, delivered at commit and only if it commits.
    func notifyLockRelease() throws {
        _ = try db.query("SELECT pg_notify('\(PostgresSchema.lockChannel)', '')")
    }
}
