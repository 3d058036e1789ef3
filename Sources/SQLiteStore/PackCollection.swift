import DocumentEngine
import Foundation
import GRDB
import VersionedStore

#if canImport(Glibc)
    import Glibc
#endif

extension SQLiteBackend {
    /// A pack is rewritten once at least this much of it, and half of it, is garbage.
    static let packGarbageWorthMoving: Int64 = 1 << 20
    /// Chunk bytes moved per transaction, so that writers wait for one part of a move at a time.
    static let packBytesPerMove: Int64 = 64 << 20

    /// Gives back the pack space of chunks that garbage collection deleted (or that a crash left
    /// unnamed): removes the packs no chunk names, and moves the chunks of packs that are mostly
    /// garbage into this process's pack, then removes those too.
    ///
    /// A pack a writer holds (its shared lock, inside a transaction) is left alone: its unnamed
    /// bytes may be a transaction about to commit. Readers whose snapshot still names a removed pack look the
    /// chunk up again (``PackFiles/readChunk(_:at:_:)``). `movingAll` moves every pack's chunks
    /// whatever its garbage, for tests.
    func collectPacks(movingAll: Bool = false) throws {
        let files = packs.files()
        guard !files.isEmpty else { return }
        let live: [Int64: Int64]
        do {
            live = try pool.read { db in
                var live: [Int64: Int64] = [:]
                for row in try Row.fetchAll(
                    db, sql: "SELECT pack, TOTAL(size) FROM packed_chunks GROUP BY pack")
                {
                    live[try row.stored(0, "pack")] = Int64(try row.stored(1, "size", as: Double.self))
                }
                return live
            }
        } catch {
            throw Self.storeError(error, path: path)
        }
        var removed = false
        for file in files {
            let liveBytes = live[file.id] ?? 0
            let garbage = file.size - liveBytes
            if liveBytes > 0, !movingAll, garbage < Self.packGarbageWorthMoving || garbage * 2 < file.size {
                continue
            }
            // Not waited for: a writer holds a shared lock on the pack it appends to.
            let fd = open(packs.path(file.id), O_RDONLY | O_CLOEXEC)
            guard fd >= 0 else { continue }
            defer { close(fd) }
            guard PackFiles.lock(fd, LOCK_EX | LOCK_NB) else { continue }
            // Asked again now that no writer holds it: one may have committed since `live` was read.
            if try packedBytes(in: file.id) > 0 {
                packs.letGo(file.id)
                try movePack(file.id)
            }
            guard try packedBytes(in: file.id) == 0 else { continue }
            if unlink(packs.path(file.id)) == 0 {
                packs.forget(file.id)
                removed = true
            }
        }
        if removed { try Self.syncFolder(packs.folder, path: packs.folder, doing: "sync") }
    }

    /// The bytes of chunks in `pack`, read from the latest commit.
    private func packedBytes(in pack: Int64) throws -> Int64 {
        do {
            return try pool.read { db in
                Int64(
                    try Double.fetchOne(
                        db, sql: "SELECT TOTAL(size) FROM packed_chunks WHERE pack = ?", arguments: [pack])
                        ?? 0)
            }
        } catch {
            throw Self.storeError(error, path: path)
        }
    }

    /// Moves every chunk of `pack` into this process's pack, checking each against its hash on
    /// the way, in durable transactions of about ``packBytesPerMove``.
    private func movePack(_ pack: Int64) throws {
        while true {
            let moved = try writeDatabase(durable: true) { db -> Int in
                // All fetched before any is moved: the moves change the rows the query walks.
                let rows = try Row.fetchAll(
                    db,
                    sql: """
                        SELECT p.id, p.position, p.size, c.hash FROM packed_chunks p JOIN chunks c ON c.id = p.id
                        WHERE p.pack = ? ORDER BY p.position LIMIT 4096
                        """, arguments: [pack])
                var count = 0
                var bytes: Int64 = 0
                for row in rows where bytes < Self.packBytesPerMove {
                    let id: Int64 = try row.stored(0, "id")
                    let place = PackFiles.Place(
                        pack: pack, position: try row.stored(1, "position"),
                        size: Int(try row.stored(2, "size", as: Int64.self)))
                    let data = try packs.read(place)
                    guard VersionedStore.hash(data) == (try row.stored(3, "hash", as: Data.self)) else {
                        throw DocumentStoreError.corrupt(
                            path: path,
                            reason: "chunk \(id) in pack \(PackFiles.name(pack)) does not match its hash")
                    }
                    // Where it was in its page, so that reads of its file stay page-aligned.
                    let phase = Int(place.position % Int64(PackFiles.pageSize))
                    guard let moved = try packs.place(data, force: true, phase: phase) else { continue }
                    try db.execute(
                        sql: "UPDATE packed_chunks SET pack = ?, position = ? WHERE id = ?",
                        arguments: [moved.pack, moved.position, id])
                    count += 1
                    bytes += Int64(place.size)
                }
                return count
            }
            if moved == 0 { return }
        }
    }
}
