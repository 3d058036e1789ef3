import Dispatch
import GRDBSQLite
import Synchronization

/// Copies the write-ahead log into the database file on a connection and thread of its own, so
/// that a commit writes and syncs only the log.
///
/// SQLite's own automatic checkpoint runs inside the commit that crosses its threshold: in an
/// image replace through the mount that was a fifth of the daemon's CPU, and it wrote every
/// byte a second time (and synced the database file) before `fsync` could return. A PASSIVE
/// checkpoint on another connection runs beside later commits; it never waits for a lock, and
/// readers never wait for it.
///
/// The writer's WAL hook (which replaces SQLite's automatic checkpoint) asks for one when the
/// log holds ``threshold`` frames. If the log still reaches ``backstop`` frames, because this
/// thread cannot keep up or another process holds a reader, the writer checkpoints inside its
/// commit as SQLite would, so the log stays bounded.
final class Checkpointer: Sendable {
    /// SQLite's default automatic checkpoint: 1,000 frames (4 MiB with 4 KiB pages).
    static let threshold: Int32 = 1000
    /// 32 MiB with 4 KiB pages.
    static let backstop: Int32 = 8000

    private let path: String
    private let queue = DispatchQueue(label: "docfs.store.checkpoint", qos: .utility)
    /// The checkpointing connection, opened on first use; used only on `queue`.
    private let connection = Mutex<OpaquePointer?>(nil)
    private let requested = Atomic(false)
    private let completed = Atomic(0)
    private let closed = Atomic(false)

    init(path: String) { self.path = path }

    deinit { connection.withLock { if let db = $0 { sqlite3_close_v2(db) } } }

    /// Installs the WAL hook on the writer connection `db`, which must not outlive `self`
    /// unless ``uninstall(from:)`` ran first.
    func install(on db: OpaquePointer) {
        sqlite3_wal_hook(db, walHook, Unmanaged.passUnretained(self).toOpaque())
    }

    /// Gives the writer connection SQLite's automatic checkpoint back.
    func uninstall(from db: OpaquePointer) {
        sqlite3_wal_autocheckpoint(db, Self.threshold)
    }

    /// The number of background checkpoints that have run, for tests.
    var checkpoints: Int { completed.load(ordering: .acquiring) }

    /// Waits for a requested checkpoint and closes the connection; later requests are ignored.
    func close() {
        closed.store(true, ordering: .releasing)
        queue.sync {}
        connection.withLock { db in
            if let open = db { sqlite3_close_v2(open) }
            db = nil
        }
    }

    /// Runs `body` while no background checkpoint runs: a checkpoint that needs the whole log
    /// (TRUNCATE) fails at once, busy handler or not, if another connection is checkpointing.
    func excluding<T>(_ body: () throws -> T) rethrows -> T { try queue.sync(execute: body) }

    /// Holds background checkpoints back until ``resume()``, for tests.
    func suspend() { queue.suspend() }
    func resume() { queue.resume() }

    /// Called by the hook after each commit, on the writer's thread.
    fileprivate func committed(db: OpaquePointer?, name: UnsafePointer<CChar>?, frames: Int32) {
        if frames >= Self.backstop, let db {
            // What SQLite's own hook does; a busy or failed checkpoint leaves the log as it is.
            _ = sqlite3_wal_checkpoint_v2(db, name, SQLITE_CHECKPOINT_PASSIVE, nil, nil)
            return
        }
        guard frames >= Self.threshold, !closed.load(ordering: .acquiring),
            !requested.exchange(true, ordering: .acquiringAndReleasing)
        else { return }
        queue.async { [self] in
            requested.store(false, ordering: .releasing)
            guard !closed.load(ordering: .acquiring) else { return }
            connection.withLock { db in
                if db == nil { db = Self.open(path) }
                guard let open = db else { return }
                // PASSIVE: copies what no reader still needs, takes no lock that a reader or
                // the writer waits for, and returns busy if another checkpoint is running.
                if sqlite3_wal_checkpoint_v2(open, nil, SQLITE_CHECKPOINT_PASSIVE, nil, nil) == SQLITE_OK {
                    completed.add(1, ordering: .releasing)
                }
            }
        }
    }

    /// FULL: the checkpoint syncs the log before it copies (a deferred save's frames may not be
    /// on disk yet) and the database file before the log may be restarted. Reading the schema
    /// opens the log, which a checkpoint on a fresh connection needs.
    private static func open(_ path: String) -> OpaquePointer? {
        openPlainConnection(path, setup: "PRAGMA synchronous = FULL; SELECT count(*) FROM sqlite_schema")
    }
}

private func walHook(
    _ context: UnsafeMutableRawPointer?, _ db: OpaquePointer?, _ name: UnsafePointer<CChar>?, _ frames: Int32
) -> Int32 {
    if let context {
        Unmanaged<Checkpointer>.fromOpaque(context).takeUnretainedValue().committed(
            db: db, name: name, frames: frames)
    }
    return SQLITE_OK
}
