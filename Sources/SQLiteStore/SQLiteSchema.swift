import GRDB

/// The SQLite store's schema and its migrations.
///
/// History is kept without copying: a wrapper is a series of immutable rows in `nodes`, one per
/// version that changed it, and a file's contents are rows in `extents` (a chunk at a byte offset),
/// one per version that changed what begins at that offset. The state at version V is, per wrapper (and per chunk index), the row
/// with the highest version ≤ V. So a save writes only the rows it changes, and reading an old
/// version needs no copy. `branch` is 0 for the main line; a conflict version's rows carry its own
/// id as branch and apply on top of the main line as of the version it was based on.
///
/// `extents_live` repeats, per file, the main line's newest extent at each start, without the
/// removals, plus a row at start −1 whose version is the newest of all the file's main-line
/// rows: a read as of a version at or after that one needs only these rows. It is derived data,
/// kept in step by every write of `extents` and rebuilt from it where rows are removed.
///
/// `packed_chunks` says where a chunk's bytes are when they are in a pack beside the store
/// (`PackFiles`); its row in `chunks` then has empty data.
enum SQLiteSchema {
    /// The store format this program writes; stores with a higher one are refused.
    static let formatVersion = 11
    /// `PRAGMA application_id`: "DocF", so other SQLite files are recognised as foreign.
    static let applicationID: Int32 = 0x446F_6346

    /// The migrations. `chunkSize` is recorded when the store is created (v1), in the same
    /// transaction as the schema and the application id, so a crash while creating a store leaves
    /// either nothing or a complete store.
    static func migrator(chunkSize: Int) -> DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in
            try db.execute(sql: "PRAGMA application_id = \(applicationID)")
            try db.execute(
                sql: """
                    CREATE TABLE store_meta (
                        key TEXT PRIMARY KEY,
                        value INTEGER NOT NULL
                    );
                    CREATE TABLE documents (
                        id INTEGER PRIMARY KEY AUTOINCREMENT,
                        name TEXT NOT NULL,
                        type TEXT NOT NULL,
                        kind INTEGER NOT NULL,
                        root INTEGER NOT NULL,
                        current_version INTEGER NOT NULL,
                        created INTEGER NOT NULL,
                        modified INTEGER NOT NULL,
                        deleted INTEGER
                    );
                    CREATE UNIQUE INDEX documents_live_name ON documents(name) WHERE deleted IS NULL;
                    CREATE TABLE versions (
                        id INTEGER PRIMARY KEY AUTOINCREMENT,
                        document INTEGER NOT NULL REFERENCES documents(id),
                        base INTEGER,
                        created INTEGER NOT NULL,
                        origin TEXT NOT NULL,
                        branch INTEGER NOT NULL DEFAULT 0,
                        resolved INTEGER NOT NULL DEFAULT 0,
                        bytes_written INTEGER NOT NULL DEFAULT 0
                    );
                    CREATE INDEX versions_by_document ON versions(document, id);
                    CREATE TABLE nodes (
                        node INTEGER NOT NULL,
                        branch INTEGER NOT NULL,
                        version INTEGER NOT NULL,
                        document INTEGER NOT NULL,
                        parent INTEGER,
                        name TEXT NOT NULL,
                        preferred_name TEXT,
                        kind INTEGER NOT NULL,
                        permissions INTEGER NOT NULL,
                        uid INTEGER NOT NULL,
                        gid INTEGER NOT NULL,
                        mtime INTEGER NOT NULL,
                        ctime INTEGER NOT NULL,
                        atime INTEGER NOT NULL,
                        btime INTEGER NOT NULL,
                        size INTEGER NOT NULL,
                        link_target TEXT,
                        xattrs BLOB,
                        removed INTEGER NOT NULL DEFAULT 0,
                        PRIMARY KEY (node, branch, version)
                    ) WITHOUT ROWID;
                    CREATE INDEX nodes_by_document ON nodes(document, branch, version);
                    CREATE INDEX nodes_by_parent ON nodes(parent, name);
                    CREATE TABLE chunks (
                        id INTEGER PRIMARY KEY AUTOINCREMENT,
                        hash BLOB NOT NULL UNIQUE,
                        size INTEGER NOT NULL,
                        data BLOB NOT NULL
                    );
                    CREATE TABLE chunk_map (
                        node INTEGER NOT NULL,
                        branch INTEGER NOT NULL,
                        idx INTEGER NOT NULL,
                        version INTEGER NOT NULL,
                        chunk INTEGER,
                        PRIMARY KEY (node, branch, idx, version)
                    ) WITHOUT ROWID;
                    CREATE INDEX chunk_map_by_chunk ON chunk_map(chunk);
                    CREATE TABLE events (
                        sequence INTEGER PRIMARY KEY AUTOINCREMENT,
                        kind TEXT NOT NULL,
                        document INTEGER NOT NULL,
                        version INTEGER,
                        name TEXT NOT NULL,
                        origin TEXT NOT NULL,
                        time INTEGER NOT NULL
                    );
                    """)
            try db.execute(
                sql:
                    "INSERT INTO store_meta(key, value) VALUES ('format', ?), ('chunk_size', ?), ('next_node', 1)",
                arguments: [formatVersion, chunkSize])
        }
        // v2: store settings (the retention policy).
        migrator.registerMigration("v2") { db in
            try db.execute(sql: "CREATE TABLE store_settings (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            try db.execute(sql: "UPDATE store_meta SET value = 2 WHERE key = 'format'")
        }
        // v3: contents are extents (a chunk at a byte offset) instead of chunks at fixed indices,
        // so chunk boundaries can follow the content. A fixed-size chunk is the extent at
        // index × chunk size, as long as its bytes: old stores keep reading the same.
        migrator.registerMigration("v3") { db in
            try db.execute(
                sql: """
                    CREATE TABLE extents (
                        node INTEGER NOT NULL,
                        branch INTEGER NOT NULL,
                        start INTEGER NOT NULL,
                        version INTEGER NOT NULL,
                        chunk INTEGER,
                        length INTEGER NOT NULL,
                        PRIMARY KEY (node, branch, start, version)
                    ) WITHOUT ROWID;
                    INSERT INTO extents(node, branch, start, version, chunk, length)
                        SELECT m.node, m.branch, m.idx * (SELECT value FROM store_meta WHERE key = 'chunk_size'),
                            m.version, m.chunk, COALESCE(c.size, 0)
                        FROM chunk_map m LEFT JOIN chunks c ON c.id = m.chunk;
                    DROP TABLE chunk_map;
                    CREATE INDEX extents_by_chunk ON extents(chunk);
                    UPDATE store_meta SET value = 3 WHERE key = 'format';
                    """)
        }
        // v4: an index that yields a document's rows in node order, newest first, so that its
        // latest records are one index walk with no grouping (B6: reading 10,000 records took
        // half the time of Document.open). No row changes, but an older program would not
        // know the migration, so the format says 4.
        migrator.registerMigration("v4") { db in
            try db.execute(
                sql: """
                    CREATE INDEX nodes_by_document_node ON nodes(document, branch, node, version);
                    UPDATE store_meta SET value = 4 WHERE key = 'format';
                    """)
        }
        // v5: special files (fifos, sockets, devices) are wrappers; a device keeps its number.
        migrator.registerMigration("v5") { db in
            try db.execute(
                sql: """
                    ALTER TABLE nodes ADD COLUMN device INTEGER NOT NULL DEFAULT 0;
                    UPDATE store_meta SET value = 5 WHERE key = 'format';
                    """)
        }
        // v6: hard links; a record that is another name of a wrapper names it.
        migrator.registerMigration("v6") { db in
            try db.execute(
                sql: """
                    ALTER TABLE nodes ADD COLUMN link_of INTEGER;
                    UPDATE store_meta SET value = 6 WHERE key = 'format';
                    """)
        }
        // v7: the main line's current extents, so that reading or saving the current contents
        // walks the file's extents, not every row its history left (B2: a file replaced 150 times
        // had 943 starts in 2,034 rows for 7 live extents). See `SQLiteTransaction.extents`.
        migrator.registerMigration("v7") { db in
            try db.execute(
                sql: """
                    CREATE TABLE extents_live (
                        node INTEGER NOT NULL,
                        start INTEGER NOT NULL,
                        version INTEGER NOT NULL,
                        chunk INTEGER,
                        length INTEGER NOT NULL,
                        PRIMARY KEY (node, start)
                    ) WITHOUT ROWID;
                    UPDATE store_meta SET value = 7 WHERE key = 'format';
                    """)
            try SQLiteTransaction(db: db).rebuildLiveExtents(of: nil)
        }
        // v8: the names index orders each name's rows by branch, removal and version, so that
        // the check that a saved name is free reads one row, not every wrapper that ever had the
        // name (`PortableSQL.nodesNamed`; after 1,000 safe-saves of one file a save took 23.7 ms).
        migrator.registerMigration("v8") { db in
            try db.execute(
                sql: """
                    DROP INDEX IF EXISTS nodes_by_parent;
                    CREATE INDEX nodes_by_name ON nodes(parent, name, branch, removed, version);
                    UPDATE store_meta SET value = 8 WHERE key = 'format';
                    """)
        }
        // v9: large chunks' bytes in pack files beside the store (`PackFiles`); their rows in
        // `chunks` keep the hash and size, with empty data. Older programs would read the empty
        // data as the chunk's bytes, so the format says 9.
        migrator.registerMigration("v9") { db in
            try db.execute(
                sql: """
                    CREATE TABLE packed_chunks (
                        id INTEGER PRIMARY KEY,
                        pack INTEGER NOT NULL,
                        position INTEGER NOT NULL,
                        size INTEGER NOT NULL
                    );
                    CREATE INDEX packed_chunks_by_pack ON packed_chunks(pack, position);
                    UPDATE store_meta SET value = 9 WHERE key = 'format';
                    """)
        }
        // v10: no index of extents by chunk. Only garbage collection looked chunks up in it, and
        // every save paid for it: a copy's rows name the source's chunks, so its index entries
        // landed among every earlier reference to them, and a 1 GiB `cp` wrote 700 KB to the
        // log with one earlier copy in the history, 960 KB with three, and 420 KB without the
        // index. Collection now finds unreferenced chunks with one pass over the extents
        // (`SQLiteTransaction.removeUnreferencedChunks`). An older program would not know the
        // migration, so the format says 10.
        migrator.registerMigration("v10") { db in
            try db.execute(
                sql: """
                    DROP INDEX IF EXISTS extents_by_chunk;
                    UPDATE store_meta SET value = 10 WHERE key = 'format';
                    """)
        }
        // v11: the lock tables, which every mount of the store shares (`VersionedStore+Locks`):
        // sessions with a lease, their locks, and the waits of blocked requests.
        migrator.registerMigration("v11") { db in
            try db.execute(
                sql: """
                    CREATE TABLE lock_sessions (
                        id INTEGER PRIMARY KEY, label TEXT NOT NULL, expires INTEGER NOT NULL);
                    CREATE TABLE file_locks (
                        node INTEGER NOT NULL, session INTEGER NOT NULL, owner INTEGER NOT NULL,
                        kind INTEGER NOT NULL, exclusive INTEGER NOT NULL, start INTEGER NOT NULL,
                        last INTEGER NOT NULL, pid INTEGER NOT NULL);
                    CREATE INDEX file_locks_by_node ON file_locks(node);
                    CREATE INDEX file_locks_by_session ON file_locks(session, owner);
                    CREATE TABLE lock_waits (
                        session INTEGER NOT NULL, owner INTEGER NOT NULL, node INTEGER NOT NULL,
                        exclusive INTEGER NOT NULL, start INTEGER NOT NULL, last INTEGER NOT NULL,
                        PRIMARY KEY (session, owner));
                    UPDATE store_meta SET value = 11 WHERE key = 'format';
                    """)
        }
        return migrator
    }
}
