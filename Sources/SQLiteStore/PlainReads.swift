import Foundation
import GRDB
import GRDBSQLite
import Synchronization

/// Reads that need no snapshot, on plain SQLite connections of their own: byte ranges of chunks
/// (a cold random read through the mount), and a document's current version (the mount's check
/// before every open).
///
/// Through the pool, a 4 KiB slice cost more in GRDB's bookkeeping than in SQLite: a queue hop,
/// a schema-version check, and a BEGIN and COMMIT, about half of a cold random read's CPU. A
/// chunk's bytes never change, so a slice needs no snapshot: the blob handle's own statement is
/// the read, and it ends when the handle closes, so no read holds the log back. A packed chunk's
/// place is one statement on the same connection, and its bytes one `pread` from its pack. A
/// document's current version is one statement too, which sees the latest commit.
final class PlainReads: Sendable {
    /// One connection, used by one read at a time.
    private typealias Connection = PlainReadConnection

    private let path: String
    private let packs: PackFiles
    private let idle = Mutex<[Connection]>([])
    /// Connections kept between reads; more are opened while more reads run at once.
    static let keptIdle = 4

    init(path: String, packs: PackFiles) {
        self.path = path
        self.packs = packs
    }

    /// All of chunk `id`'s bytes; nil if there is no such chunk or no connection could be
    /// opened (the caller then reads it with a query).
    func whole(_ id: Int64) throws -> Data? { try read(id, nil) }

    /// `range` of chunk `id`'s bytes; nil if there is no such chunk, the range is outside it, or
    /// no connection could be opened (the caller then reads the whole chunk).
    func read(_ id: Int64, _ range: Range<Int>) throws -> Data? {
        guard range.lowerBound >= 0, range.upperBound <= Int(Int32.max) else { return nil }
        return try read(id, .some(range))
    }

    /// `range` of chunk `id`'s bytes into `buffer` (as long as the range); false where
    /// ``read(_:_:)`` gives nil.
    func read(_ id: Int64, _ range: Range<Int>, into buffer: UnsafeMutableRawBufferPointer) throws -> Bool {
        guard buffer.count == range.count, range.lowerBound >= 0, range.upperBound <= Int(Int32.max) else {
            return false
        }
        if case .some(.some(let place)) = packs.cachedPlace(id) {
            guard range.upperBound <= place.size else { return false }
            try packs.readChunk(id, at: place, range, into: buffer)
            return true
        }
        guard let data = try read(id, .some(range)), data.count == range.count else { return false }
        _ = data.copyPrefix(into: buffer)
        return true
    }

    /// `range` (nil: all) of chunk `id`'s bytes.
    private func read(_ id: Int64, _ wanted: Range<Int>?) throws -> Data? {
        let known = packs.cachedPlace(id)
        if case .some(.some(let place)) = known { return try packed(id, place, wanted) }
        guard let connection = take() else { return nil }
        defer { give(connection) }
        if known == nil {
            let place = try learnPlaces(around: id, connection)
            if let place { return try packed(id, place, wanted) }
        }
        var blob: OpaquePointer?
        let opened = sqlite3_blob_open(connection.db, "main", "chunks", "data", id, 0, &blob)
        guard opened == SQLITE_OK, let blob else {
            if let blob { sqlite3_blob_close(blob) }
            // No such row (collected): the full read reports it. Anything else is an error.
            if opened == SQLITE_ERROR { return nil }
            throw DatabaseError(resultCode: ResultCode(rawValue: opened))
        }
        defer { sqlite3_blob_close(blob) }
        let range = wanted ?? 0..<Int(sqlite3_blob_bytes(blob))
        guard range.upperBound <= Int(sqlite3_blob_bytes(blob)) else { return nil }
        var data = Data(count: range.count)
        let status = data.withUnsafeMutableBytes { buffer in
            sqlite3_blob_read(blob, buffer.baseAddress, Int32(range.count), Int32(range.lowerBound))
        }
        guard status == SQLITE_OK else { throw DatabaseError(resultCode: ResultCode(rawValue: status)) }
        return data
    }

    /// The current version of `document`; nil if there is no such document or no connection
    /// could be opened (the caller then reads it with a query).
    func currentVersion(of document: Int64) throws -> Int64? {
        guard let connection = take() else { return nil }
        defer { give(connection) }
        return try connection.currentVersion(of: document)
    }

    /// `wanted` (nil: all) of the packed chunk `id` at `place`; nil when it runs past the chunk.
    private func packed(_ id: Int64, _ place: PackFiles.Place, _ wanted: Range<Int>?) throws -> Data? {
        if let wanted, wanted.upperBound > place.size { return nil }
        return try packs.readChunk(id, at: place, wanted)
    }

    /// Chunk `id`'s place (nil: not packed). A packed chunk's place comes with the places of the
    /// packed chunks with nearby ids: a file's chunks have consecutive ids, and random reads over
    /// a large file otherwise looked each one up on its own (1,800 statements for 256 MiB, some
    /// 12 µs each). A chunk in a row (a small save's) costs its own lookup only, so that a first
    /// read of many small files does not scan a large file's places around each of them.
    private func learnPlaces(around id: Int64, _ connection: Connection) throws -> PackFiles.Place? {
        guard let place = try connection.place(id) else {
            packs.cache(nil, of: id)
            return nil
        }
        let (low, lowOverflow) = id.subtractingReportingOverflow(Self.placesAround)
        let (high, highOverflow) = id.addingReportingOverflow(Self.placesAround)
        let found = try connection.places((lowOverflow ? .min : low)...(highOverflow ? .max : high))
        packs.cache(found)
        return place
    }

    /// How far either side of a chunk's id ``learnPlaces(around:_:)`` looks.
    static let placesAround: Int64 = 512

    private func take() -> Connection? {
        if let connection = idle.withLock({ $0.popLast() }) { return connection }
        // Waits for a lock as long as the pool's readers do (only while a log is recovered).
        return openPlainConnection(path, setup: "PRAGMA busy_timeout = 30000; PRAGMA query_only = 1")
            .flatMap(Connection.init)
    }

    private func give(_ connection: Connection) {
        // A connection over the limit closes when its last reference goes.
        idle.withLock { if $0.count < Self.keptIdle { $0.append(connection) } }
    }
}
