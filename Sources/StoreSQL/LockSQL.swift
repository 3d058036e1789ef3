/// The lock tables' statements, which both SQL backends run as written (with `?` placeholders;
/// PostgreSQL's connection numbers them).
package enum LockSQL {
    package static let expiredSessions = "SELECT id FROM lock_sessions WHERE expires < ?"
    package static let insertSession = "INSERT INTO lock_sessions(label, expires) VALUES (?, ?) RETURNING id"
    package static let renewSession =
        "UPDATE lock_sessions SET expires = ? WHERE id = ? AND expires >= ? RETURNING id"
    package static let removeSession = "DELETE FROM lock_sessions WHERE id = ?"
    package static let removeSessionWaits = "DELETE FROM lock_waits WHERE session = ?"
    package static let locksOnNode =
        "SELECT node, session, owner, kind, exclusive, start, last, pid FROM file_locks WHERE node = ?"
    package static let removeOwnerKindOnNode =
        "DELETE FROM file_locks WHERE node = ? AND session = ? AND owner = ? AND kind = ?"
    package static let insertLock =
        "INSERT INTO file_locks(node, session, owner, kind, exclusive, start, last, pid) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
    /// `removeLocks`' statements: an owner or all of the session's, on one node or all of them.
    package static func removeLocks(owner: Bool, node: Bool) -> String {
        "DELETE FROM file_locks WHERE session = ?" + (owner ? " AND owner = ?" : "")
            + (node ? " AND node = ?" : "")
            + " RETURNING node"
    }
    package static let waits = "SELECT session, owner, node, exclusive, start, last FROM lock_waits"
    package static let removeWait = "DELETE FROM lock_waits WHERE session = ? AND owner = ?"
    package static let insertWait =
        "INSERT INTO lock_waits(session, owner, node, exclusive, start, last) VALUES (?, ?, ?, ?, ?, ?)"
}
