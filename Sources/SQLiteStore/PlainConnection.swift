import GRDB
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

/// The statement that finds a packed chunk's place, for plain connections.
let packedPlaceSQL = "SELECT pack, position, size FROM packed_chunks WHERE id = ?"

/// Runs `statement` (``packedPlaceSQL``, prepared on a plain connection) for chunk `id`: its
/// place, or nil when it is not packed.
func packedPlace(_ statement: OpaquePointer, _ id: Int64) throws -> PackFiles.Place? {
    sqlite3_reset(statement)
    sqlite3_bind_int64(statement, 1, id)
    defer { sqlite3_reset(statement) }
    switch sqlite3_step(statement) {
    case SQLITE_ROW:
        return placeInRow(statement, from: 0)
    case SQLITE_DONE:
        return nil
    case let status:
        throw DatabaseError(resultCode: ResultCode(rawValue: status))
    }
}

/// The place in the current row of `statement`, whose columns from `first` on are a packed
/// chunk's pack, position and size.
private func placeInRow(_ statement: OpaquePointer, from first: Int32) -> PackFiles.Place {
    PackFiles.Place(
        pack: sqlite3_column_int64(statement, first), position: sqlite3_column_int64(statement, first + 1),
        size: Int(sqlite3_column_int64(statement, first + 2)))
}

/// The statement that finds the places of the packed chunks with ids in a range.
let packedPlacesSQL = "SELECT id, pack, position, size FROM packed_chunks WHERE id BETWEEN ? AND ?"

/// A plain connection of its own with the statements of ``PlainReads`` prepared
/// (``packedPlaceSQL``, a document's current version): each step reads the store's latest
/// commit, in no snapshot a caller holds.
// @unchecked: a SQLite connection and its statements (C pointers), lent to one thread at a time.
final class PlainReadConnection: @unchecked Sendable {
    let db: OpaquePointer
    private let place: OpaquePointer
    private let places: OpaquePointer
    private let version: OpaquePointer

    /// Takes `db` over (closing it if preparing fails).
    init?(_ db: OpaquePointer) {
        var statements: [OpaquePointer] = []
        for sql in [packedPlaceSQL, packedPlacesSQL, "SELECT current_version FROM documents WHERE id = ?"] {
            var statement: OpaquePointer?
            guard sqlite3_prepare_v2(db, sql, -1, &statement, nil) == SQLITE_OK, let statement else {
                for prepared in statements { sqlite3_finalize(prepared) }
                sqlite3_close_v2(db)
                return nil
            }
            statements.append(statement)
        }
        self.db = db
        (place, places, version) = (statements[0], statements[1], statements[2])
    }

    convenience init?(path: String) {
        guard let db = openPlainConnection(path, setup: "PRAGMA busy_timeout = 30000; PRAGMA query_only = 1")
        else { return nil }
        self.init(db)
    }

    deinit {
        sqlite3_finalize(place)
        sqlite3_finalize(places)
        sqlite3_finalize(version)
        sqlite3_close_v2(db)
    }

    /// Where chunk `id`'s bytes are, if in a pack. Used by one thread at a time.
    func place(_ id: Int64) throws -> PackFiles.Place? { try packedPlace(place, id) }

    /// The places of the packed chunks with ids in `ids`. Used by one thread at a time.
    func places(_ ids: ClosedRange<Int64>) throws -> [(id: Int64, place: PackFiles.Place)] {
        sqlite3_reset(places)
        sqlite3_bind_int64(places, 1, ids.lowerBound)
        sqlite3_bind_int64(places, 2, ids.upperBound)
        defer { sqlite3_reset(places) }
        var result: [(id: Int64, place: PackFiles.Place)] = []
        while true {
            switch sqlite3_step(places) {
            case SQLITE_ROW:
                result.append((sqlite3_column_int64(places, 0), placeInRow(places, from: 1)))
            case SQLITE_DONE:
                return result
            case let status:
                throw DatabaseError(resultCode: ResultCode(rawValue: status))
            }
        }
    }

    /// The current version of `document`, nil if there is no such document. Used by one thread
    /// at a time.
    func currentVersion(of document: Int64) throws -> Int64? {
        sqlite3_reset(version)
        sqlite3_bind_int64(version, 1, document)
        defer { sqlite3_reset(version) }
        switch sqlite3_step(version) {
        case SQLITE_ROW: return sqlite3_column_int64(version, 0)
        case SQLITE_DONE: return nil
        case let status: throw DatabaseError(resultCode: ResultCode(rawValue: status))
        }
    }
}
