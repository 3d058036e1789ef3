import GRDBSQLite

/// Opens a connection to the store file of its own, outside GRDB's pool, and runs `setup` on
/// it (pragmas; a statement that reads the schema). Nil when either fails.
func openPlainConnection(_ path: String, setup: String) -> OpaquePointer? {
    var db: OpaquePointer?
    guard sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, nil) == SQLITE_OK, let db
    else {
        if let db { sqlite3_close_v2(db) }
        return nil
    }
    guard sqlite3_exec(db, setup, nil, nil, nil) == SQLITE_OK else {
        sqlite3_close_v2(db)
        return nil
    }
    return db
}
