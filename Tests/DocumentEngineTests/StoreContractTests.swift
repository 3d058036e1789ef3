import DocumentEngine
import Foundation
import PostgresStore
import SQLiteStore
import StoreTestSupport
import Synchronization
import TestSupport
import Testing
import VersionedStore

/// The stores (SQLite, PostgreSQL): documents, lazy reads, incremental and atomic saves, versions,
/// conflicts. Each test taking a `StoreKind` runs once per store.
/// The store contract: every backend (memory, SQLite, PostgreSQL) runs the same algorithm and must
/// answer alike.
@Suite struct StoreContractTests {
    let tmp: TemporaryDirectory
    let fixture: StoreFixture
    var store: any VersionedDocumentStore { fixture.store }

    init(_ kind: StoreKind = .sqlite) throws {
        tmp = try TemporaryDirectory()
        fixture = try StoreFixture(kind, chunkSize: 64 * 1024)
    }

    /// Adds a regular file with `data` to a package document and saves it.
    @discardableResult
    func addFile(_ name: String, _ data: Data, to document: DocumentInfo, parent: StoreNodeID? = nil) throws
        -> (StoreNodeID, SaveResult)
    {
        let id = try store.makeNodeIDs(count: 1)[0]
        let current = try store.document(document.id)
        var changes = DocumentChanges(document: document.id, base: current.currentVersion)
        changes.nodes = [
            NodeRecord(
                id: id, document: document.id, parent: parent ?? document.root, name: name,
                kind: .regularFile,
                permissions: 0o644)
        ]
        changes.contents[id] = .replace(DataContentsSource(data))
        return (id, try store.save(changes))
    }

    /// A package holding a.txt ("base", saved as v1), then b.txt ("b", v2).
    func twoFilePackage(_ name: String) throws -> (
        document: DocumentInfo, a: StoreNodeID, v1: SaveResult, b: StoreNodeID, v2: SaveResult
    ) {
        let doc = try store.createDocument(
            named: name, kind: .package, type: nil, permissions: nil, origin: "")
        let (a, v1) = try addFile("a.txt", Data("base".utf8), to: doc)
        let (b, v2) = try addFile("b.txt", Data("b".utf8), to: doc)
        return (doc, a, v1, b, v2)
    }

    /// Changes that replace the contents of `node` with `text`, based on `base`.
    func replacing(_ node: StoreNodeID, with text: String, in doc: DocumentInfo, at base: SaveResult)
        -> DocumentChanges
    {
        var changes = DocumentChanges(document: doc.id, base: base.version.id)
        changes.contents[node] = .replace(DataContentsSource(Data(text.utf8)))
        return changes
    }

    func contents(_ id: StoreNodeID, at version: VersionID? = nil) throws -> Data {
        let size = try #require(try store.node(id, at: version)).size
        return try store.readContents(of: id, at: version, offset: 0, count: Int(size))
    }

    @Test("A transaction finds stored chunks by hash, many in one call", arguments: StoreKind.everyBackend)
    static func chunkIDsByHash(_ kind: StoreKind) throws { try Self(kind).chunkIDsByHash() }
    func chunkIDsByHash() throws {
        let backend = try #require(store as? any VersionedDocumentStore).versionedStore.backend
        let chunks = (0..<3).map { sampleBytes(5_000 + $0, seed: UInt64(80 + $0)) }
        let hashes = chunks.map { VersionedStore.hash($0) }
        let ids = try backend.write(durable: true) { tx in
            try (0..<2).map { try tx.insertChunk(hash: hashes[$0], data: chunks[$0], offset: 0) }
        }
        // The third was never stored; a hash asked twice is answered once.
        let found = try backend.read { tx in
            try tx.chunkIDs(hashes: [hashes[0], hashes[2], hashes[1], hashes[0]])
        }
        #expect(found == [hashes[0]: ids[0], hashes[1]: ids[1]])
        #expect(try backend.read { tx in try tx.chunkIDs(hashes: []) }.isEmpty)
    }

    @Test("Documents: create, list, find, rename, delete and undelete", arguments: StoreKind.everyBackend)
    static func documentLifecycle(_ kind: StoreKind) throws { try Self(kind).documentLifecycle() }
    func documentLifecycle() throws {
        let package = try store.createDocument(
            named: "Things I Own.mystuff", kind: .package, type: nil, permissions: nil, origin: "test")
        let flat = try store.createDocument(
            named: "notes.txt", kind: .flat, type: nil, permissions: nil, origin: "test")
        #expect(try store.documents().map(\.name) == ["Things I Own.mystuff", "notes.txt"])
        #expect(flat.type == "public.plain-text")
        #expect(try store.node(package.root)?.kind == .directory)
        #expect(try store.node(flat.root)?.kind == .regularFile)
        #expect(throws: DocumentStoreError.documentExists("notes.txt")) {
            try store.createDocument(named: "notes.txt", kind: .flat, type: nil, permissions: nil, origin: "")
        }
        for bad in ["", "..", "a/b"] {
            #expect(throws: DocumentStoreError.self) {
                try store.createDocument(named: bad, kind: .flat, type: nil, permissions: nil, origin: "")
            }
        }
        let renamed = try store.renameDocument(flat.id, to: "Notes.txt")
        #expect(renamed.name == "Notes.txt" && renamed.id == flat.id)
        #expect(try store.document(named: "notes.txt") == nil)
        try store.deleteDocument(package.id, origin: "test")
        #expect(try store.documents().map(\.name) == ["Notes.txt"])
        #expect(try store.deletedDocuments().map(\.id) == [package.id])
        let back = try store.undeleteDocument(package.id, as: nil)
        #expect(back.name == "Things I Own.mystuff")
        #expect(try store.documents().count == 2)
    }

    @Test(
        "A document's current version is what document(_:) says, after another connection's save too; an unknown id throws",
        arguments: StoreKind.everyBackend)
    static func currentVersion(_ kind: StoreKind) throws { try Self(kind).currentVersion() }
    func currentVersion() throws {
        let (doc, a, _, _, v2) = try twoFilePackage("Current.pkg")
        #expect(try store.currentVersion(of: doc.id) == v2.version.id)
        // Saved through another connection: the next ask sees it (no snapshot is kept).
        let other = try fixture.reopen()
        let v3 = try other.save(replacing(a, with: "again", in: doc, at: v2))
        #expect(try store.currentVersion(of: doc.id) == v3.version.id)
        #expect(try store.currentVersion(of: doc.id) == store.document(doc.id).currentVersion)
        try other.deleteDocument(doc.id, origin: "test")
        #expect(try store.currentVersion(of: doc.id) == store.document(doc.id).currentVersion)
        #expect(throws: DocumentStoreError.noSuchDocument(DocumentID(rawValue: 999_999).description)) {
            try store.currentVersion(of: DocumentID(rawValue: 999_999))
        }
    }

    @Test(
        "Whole-file saves of several documents at once each store their own bytes (their chunks hashed on other threads or their own)",
        arguments: StoreKind.everyBackend)
    static func concurrentWholeFileSaves(_ kind: StoreKind) throws {
        try Self(kind).concurrentWholeFileSaves()
    }
    func concurrentWholeFileSaves() throws {
        let store = self.store
        let count = 4
        let documents = try (0..<count).map { index in
            try store.createDocument(
                named: "file-\(index).bin", kind: .flat, type: nil, permissions: nil, origin: "test")
        }
        let contents = (0..<count).map { sampleBytes(6 << 20, seed: 40 + UInt64($0)) }
        let failures = Mutex<[String]>([])
        // More saves at once than this machine has cores: some chunks are hashed by the thread
        // that cuts them, after the ones it handed to another thread.
        DispatchQueue.concurrentPerform(iterations: count) { index in
            do {
                var changes = DocumentChanges(
                    document: documents[index].id, base: documents[index].currentVersion)
                changes.contents[documents[index].root] = .replace(DataContentsSource(contents[index]))
                _ = try store.save(changes)
            } catch {
                failures.withLock { $0.append("\(index): \(error)") }
            }
        }
        #expect(failures.withLock { $0 }.isEmpty)
        for index in 0..<count {
            #expect(
                try store.readContents(
                    of: documents[index].root, at: nil, offset: 0, count: contents[index].count)
                    == contents[index])
        }
        #expect(try store.checkIntegrity().isClean)
    }

    @Test(
        "Lazy: listing documents and wrappers reads no contents; a ranged read reads only its chunks",
        arguments: StoreKind.everyBackend)
    static func lazyReads(_ kind: StoreKind) throws { try Self(kind).lazyReads() }
    func lazyReads() throws {
        let doc = try store.createDocument(
            named: "Big.pkg", kind: .package, type: nil, permissions: nil, origin: "")
        let big = (0..<10).map { sampleBytes(64 * 1024, seed: UInt64($0)) }.reduce(Data(), +)
        let (id, _) = try addFile("big.bin", big, to: doc)
        for i in 0..<20 { try addFile("small\(i).txt", Data("file \(i)".utf8), to: doc) }
        fixture.purgeCache()
        let before = store.statistics
        _ = try store.documents()
        let nodes = try store.nodes(of: doc.id)
        #expect(nodes.count == 22)
        #expect(
            store.statistics.bytesRead == before.bytesRead && store.statistics.chunksRead == before.chunksRead
        )

        // 100 bytes in the middle: the one or two chunks that cover them are read, no more.
        let slice = try store.readContents(of: id, at: nil, offset: 5 * 65536 + 1000, count: 100)
        #expect(slice == big.subdata(in: (5 * 65536 + 1000)..<(5 * 65536 + 1100)))
        #expect(store.statistics.chunksRead - before.chunksRead <= 2)
        #expect(store.statistics.bytesRead - before.bytesRead <= 2 * Int64(store.chunkSize))
        // 20 bytes further on read at most the chunks that cover them.
        let read = store.statistics
        _ = try store.readContents(of: id, at: nil, offset: 6 * 65536 - 10, count: 20)
        #expect(store.statistics.chunksRead - read.chunksRead <= 2)
        #expect(try contents(id) == big)
    }

    @Test("Incremental: appending one byte to a 1 GiB wrapper writes one chunk plus metadata")
    func appendToHugeFile() throws {
        let store = try SQLiteStore(path: tmp.path("Huge.docstore"), options: .create)
        let chunk = store.chunkSize
        let doc = try store.createDocument(
            named: "Huge.pkg", kind: .package, type: nil, permissions: nil, origin: "")
        let id = try store.makeNodeIDs(count: 1)[0]
        let size: Int64 = 1 << 30
        var changes = DocumentChanges(document: doc.id, base: doc.currentVersion)
        changes.nodes = [
            NodeRecord(
                id: id, document: doc.id, parent: doc.root, name: "huge.bin", kind: .regularFile,
                permissions: 0o644)
        ]
        changes.contents[id] = .replace(DistinctChunks(count: size, chunkSize: chunk))
        let first = try store.save(changes)
        #expect(first.chunksWritten == Int(size) / chunk)

        try store.checkpoint()  // empty the WAL so its size measures the next save
        let databaseBefore = try FileFacts(store.path).size
        var record = try #require(try store.node(id))
        let lastIndex = Int((size - 1) / Int64(chunk))
        var last = try store.readContents(of: id, at: nil, offset: Int64(lastIndex * chunk), count: chunk)
        last.append(0x2A)
        record.size = size + 1
        var append = DocumentChanges(document: doc.id, base: first.version.id)
        append.nodes = [record]
        append.contents[id] = .chunks(
            size: size + 1, [lastIndex: last.prefix(chunk), lastIndex + 1: Data([0x2A])])
        let result = try store.save(append)

        #expect(result.chunksWritten == 1)  // the full last chunk is unchanged; the byte starts a new one
        #expect(result.bytesWritten <= Int64(chunk) + 1)
        let wal = try FileFacts(store.path + "-wal").size
        #expect(wal <= Int64(chunk) + 192 * 1024, "the save wrote \(wal) bytes of WAL")
        #expect(try FileFacts(store.path).size == databaseBefore)
        #expect(try store.readContents(of: id, at: nil, offset: size - 1, count: 10).count == 2)
        #expect(try store.readContents(of: id, at: nil, offset: size, count: 10) == Data([0x2A]))
    }

    @Test(
        "Incremental: replacing one 1 MB image of 100 writes that image's chunks and metadata only",
        arguments: StoreKind.everyBackend)
    static func replaceOneImage(_ kind: StoreKind) throws { try Self(kind).replaceOneImage() }
    func replaceOneImage() throws {
        let doc = try store.createDocument(
            named: "Album.pkg", kind: .package, type: nil, permissions: nil, origin: "")
        var changes = DocumentChanges(document: doc.id, base: doc.currentVersion)
        let ids = try store.makeNodeIDs(count: 100)
        for (i, id) in ids.enumerated() {
            changes.nodes.append(
                NodeRecord(
                    id: id, document: doc.id, parent: doc.root, name: "image\(i).png", kind: .regularFile,
                    permissions: 0o644))
            changes.contents[id] = .replace(DataContentsSource(sampleBytes(1_000_000, seed: UInt64(i))))
        }
        let saved = try store.save(changes)
        let sqlite = store as? SQLiteStore
        try sqlite?.checkpoint()
        var replace = DocumentChanges(document: doc.id, base: saved.version.id)
        replace.contents[ids[42]] = .replace(DataContentsSource(sampleBytes(1_000_000, seed: 4242)))
        let result = try store.save(replace)
        #expect(result.bytesWritten == 1_000_000)
        #expect(result.nodesWritten == 1)
        // The log measures SQLite's writes; PostgreSQL's server log is shared with other tests.
        if let sqlite {
            let wal = try FileFacts(sqlite.path + "-wal").size
            #expect(wal <= 1_100_000 + 128 * 1024, "the save wrote \(wal) bytes of WAL")
        }
        #expect(try contents(ids[42]) == sampleBytes(1_000_000, seed: 4242))
        #expect(try contents(ids[41]) == sampleBytes(1_000_000, seed: 41))
    }

    @Test("Identical contents are stored once (content-addressed chunks)", arguments: StoreKind.everyBackend)
    static func deduplication(_ kind: StoreKind) throws { try Self(kind).deduplication() }
    func deduplication() throws {
        let doc = try store.createDocument(
            named: "Dups.pkg", kind: .package, type: nil, permissions: nil, origin: "")
        let data = sampleBytes(200_000, seed: 9)
        let (_, first) = try addFile("a.bin", data, to: doc)
        let (_, second) = try addFile("b.bin", data, to: doc)
        #expect(first.bytesWritten == 200_000)
        #expect(second.bytesWritten == 0)
    }

    @Test("Truncation and growth: bytes past a shrink read back as zeros", arguments: StoreKind.everyBackend)
    static func truncateAndGrow(_ kind: StoreKind) throws { try Self(kind).truncateAndGrow() }
    func truncateAndGrow() throws {
        let doc = try store.createDocument(
            named: "T.pkg", kind: .package, type: nil, permissions: nil, origin: "")
        let data = sampleBytes(200_000, seed: 3)
        let (id, saved) = try addFile("t.bin", data, to: doc)
        var record = try #require(try store.node(id))
        record.size = 70_000
        var shrink = DocumentChanges(document: doc.id, base: saved.version.id)
        shrink.nodes = [record]
        shrink.contents[id] = .chunks(size: 70_000, [:])
        let shrunk = try store.save(shrink)
        #expect(try contents(id) == data.prefix(70_000))
        var grow = DocumentChanges(document: doc.id, base: shrunk.version.id)
        record.size = 150_000
        grow.nodes = [record]
        grow.contents[id] = .chunks(size: 150_000, [:])
        try store.save(grow)
        #expect(try contents(id) == data.prefix(70_000) + Data(count: 80_000))
        #expect(try store.checkIntegrity().isClean)
    }

    @Test(
        "Versions: every save is one; old versions read as they were; restore is a new save",
        arguments: StoreKind.everyBackend)
    static func versions(_ kind: StoreKind) throws { try Self(kind).versions() }
    func versions() throws {
        let doc = try store.createDocument(
            named: "V.pkg", kind: .package, type: nil, permissions: nil, origin: "app")
        let (a, v1) = try addFile("a.txt", Data("one".utf8), to: doc)
        var change = DocumentChanges(document: doc.id, base: v1.version.id)
        change.contents[a] = .replace(DataContentsSource(Data("two".utf8)))
        change.origin = "mount"
        let v2 = try store.save(change)
        let (b, v3) = try addFile("b.txt", Data("bee".utf8), to: doc)

        let versions = try store.versions(of: doc.id)
        #expect(versions.map(\.id) == [doc.currentVersion, v1.version.id, v2.version.id, v3.version.id])
        #expect(versions[2].base == v1.version.id && versions[2].origin == "mount")
        #expect(try contents(a, at: v1.version.id) == Data("one".utf8))
        #expect(try contents(a) == Data("two".utf8))
        #expect(try store.nodes(of: doc.id, at: v1.version.id).map(\.name).sorted() == ["V.pkg", "a.txt"])
        #expect(try store.node(b, at: v2.version.id) == nil)

        let restored = try store.restore(v1.version.id, of: doc.id, origin: "restore")
        #expect(try store.document(doc.id).currentVersion == restored.version.id)
        #expect(try contents(a) == Data("one".utf8))
        #expect(try store.node(b) == nil)
        #expect(try contents(b, at: v3.version.id) == Data("bee".utf8))  // history is intact
        #expect(try store.events(after: 0).last?.kind == .restored)
    }

    @Test(
        "Conflicts: a save based on an old version keeps both; rebase and fail policies",
        arguments: StoreKind.everyBackend)
    static func conflicts(_ kind: StoreKind) throws { try Self(kind).conflicts() }
    func conflicts() throws {
        let (doc, a, v1, b, v2) = try twoFilePackage("C.pkg")

        // Another writer still at v1 changes a.txt: b.txt was added since, a.txt was not changed.
        var disjoint = DocumentChanges(document: doc.id, base: v1.version.id)
        disjoint.contents[a] = .replace(DataContentsSource(Data("theirs".utf8)))
        disjoint.conflictPolicy = .rebaseIfDisjoint
        let rebased = try store.save(disjoint)
        #expect(!rebased.isConflict)
        #expect(try contents(a) == Data("theirs".utf8) && (try contents(b)) == Data("b".utf8))

        // A third writer at v2 also changed a.txt: that conflicts.
        var mine = DocumentChanges(document: doc.id, base: v2.version.id)
        mine.contents[a] = .replace(DataContentsSource(Data("mine".utf8)))
        mine.conflictPolicy = .rebaseIfDisjoint
        let conflict = try store.save(mine)
        #expect(conflict.isConflict)
        #expect(try contents(a) == Data("theirs".utf8))  // nothing overwritten
        #expect(try contents(a, at: conflict.version.id) == Data("mine".utf8))  // both kept
        #expect(try contents(b, at: conflict.version.id) == Data("b".utf8))
        #expect(
            try store.versions(of: doc.id).filter { $0.isConflict && !$0.isResolved }.map(\.id) == [
                conflict.version.id
            ])

        var strict = DocumentChanges(document: doc.id, base: v1.version.id)
        strict.contents[a] = .replace(DataContentsSource(Data("x".utf8)))
        strict.conflictPolicy = .fail
        #expect(throws: DocumentStoreError.self) { try store.save(strict) }

        #expect(try store.unresolvedConflicts().map(\.id) == [conflict.version.id])
        let before = try store.latestEventSequence()
        try store.resolveConflict(conflict.version.id)
        #expect(try store.versions(of: doc.id).first { $0.id == conflict.version.id }?.isResolved == true)
        #expect(try store.unresolvedConflicts().isEmpty)
        // Resolving is an event (so that mounts drop the conflict's entry); once only.
        try store.resolveConflict(conflict.version.id)
        let events = try store.events(after: before)
        #expect(events.map(\.kind) == [.resolved], "\(events)")
        #expect(events.first?.version == conflict.version.id && events.first?.document == doc.id)

        // A deleted document's conflicts are not listed.
        var again = DocumentChanges(document: doc.id, base: v2.version.id)
        again.contents[a] = .replace(DataContentsSource(Data("again".utf8)))
        #expect(try store.save(again).isConflict)
        #expect(try store.unresolvedConflicts().count == 1)
        try store.deleteDocument(doc.id, origin: "test")
        #expect(try store.unresolvedConflicts().isEmpty)
    }

    @Test(
        "Rebase: two writers adding names to one folder merge (its times are the later ones, a chmod stays); the same name, or a name in a removed folder, conflicts",
        arguments: StoreKind.everyBackend)
    static func rebaseMergesFolderTimes(_ kind: StoreKind) throws { try Self(kind).rebaseMergesFolderTimes() }
    func rebaseMergesFolderTimes() throws {
        let doc = try store.createDocument(
            named: "M.pkg", kind: .package, type: nil, permissions: nil, origin: "")
        let sub = try store.makeNodeIDs(count: 1)[0]
        var made = DocumentChanges(document: doc.id, base: try store.document(doc.id).currentVersion)
        made.nodes = [
            NodeRecord(
                id: sub, document: doc.id, parent: doc.root, name: "sub", kind: .directory, permissions: 0o755
            )
        ]
        let v1 = try store.save(made).version.id
        let rootAtV1 = try #require(try store.node(doc.root))

        /// A save based on v1 that adds `name` in `parent` at time `time` (seconds), with the
        /// folder's times moved to it, as a mount's create does.
        func adding(_ name: String, in parent: StoreNodeID, at time: Int64, permissions: Int? = nil) throws
            -> DocumentChanges
        {
            let id = try store.makeNodeIDs(count: 1)[0]
            var folder = try #require(try store.node(parent, at: v1))
            folder.modified = Timestamp(seconds: time, nanoseconds: 0)
            folder.changed = folder.modified
            if let permissions { folder.permissions = permissions }
            var changes = DocumentChanges(document: doc.id, base: v1)
            changes.nodes = [
                folder,
                NodeRecord(
                    id: id, document: doc.id, parent: parent, name: name, kind: .regularFile,
                    permissions: 0o644),
            ]
            changes.contents[id] = .replace(DataContentsSource(Data(name.utf8)))
            changes.conflictPolicy = .rebaseIfDisjoint
            return changes
        }
        let later = rootAtV1.modified.rawValue / 1_000_000_000 + 100
        // The first writer also makes the folder 0700; the second only adds a name.
        #expect(!(try store.save(adding("one", in: doc.root, at: later + 10, permissions: 0o700)).isConflict))
        let second = try store.save(adding("two", in: doc.root, at: later))
        #expect(!second.isConflict && second.rebasedOnto != nil)
        let names = try store.nodes(of: doc.id, at: nil).filter { $0.parent == doc.root }.map(\.name).sorted()
        #expect(names == ["one", "sub", "two"])
        let root = try #require(try store.node(doc.root))
        #expect(root.permissions == 0o700, "the second writer's folder record did not undo the chmod")
        #expect(root.modified == Timestamp(seconds: later + 10, nanoseconds: 0), "the later time stays")

        // The same name from a writer that did not see the first: kept as a conflict, not an error.
        let same = try store.save(adding("one", in: doc.root, at: later + 20))
        #expect(same.isConflict)
        #expect(try store.node(doc.root)?.modified == Timestamp(seconds: later + 10, nanoseconds: 0))

        // A name added in a folder that another writer removed: a conflict too.
        var removal = DocumentChanges(document: doc.id, base: try store.document(doc.id).currentVersion)
        removal.removedNodes = [sub]
        _ = try store.save(removal)
        #expect(try store.save(adding("inside", in: sub, at: later + 30)).isConflict)
        #expect(try store.nodes(of: doc.id, at: nil).map(\.name).sorted() == ["M.pkg", "one", "two"])
    }

    @Test(
        "Many lookups at once answer as one lookup each: current, old, conflict, removed, missing",
        arguments: StoreKind.everyBackend)
    static func batchLookups(_ kind: StoreKind) throws { try Self(kind).batchLookups() }
    func batchLookups() throws {
        let (doc, a, v1, b, v2) = try twoFilePackage("Batch.pkg")
        // Two writers at v2 change a.txt: the first saves v3, the second a conflict version.
        let v3 = try store.save(replacing(a, with: "theirs", in: doc, at: v2))
        let conflict = try store.save(replacing(a, with: "mine, longer", in: doc, at: v2))
        #expect(conflict.isConflict)
        var remove = DocumentChanges(document: doc.id, base: v3.version.id)
        remove.removedNodes = [b]
        try store.save(remove)

        let lookups = [
            NodeLookup(a, at: nil), NodeLookup(b, at: nil), NodeLookup(b, at: v2.version.id),
            NodeLookup(a, at: conflict.version.id), NodeLookup(a, at: v1.version.id),
            NodeLookup(StoreNodeID(rawValue: 999_999), at: nil),
            NodeLookup(a, at: VersionID(rawValue: 999_999)),
            NodeLookup(doc.root, at: v1.version.id), NodeLookup(b, at: conflict.version.id),
        ]
        let answers = try store.nodes(lookups)
        #expect(answers.count == lookups.count)
        for (lookup, answer) in zip(lookups, answers) {
            let single = Result { try store.node(lookup.node, at: lookup.version) }
            switch (answer, single) {
            case (.success(let batched), .success(let alone)): #expect(batched == alone, "\(lookup)")
            case (.failure, .failure): break
            default: Issue.record("\(lookup): \(answer) in a batch, \(single) alone")
            }
        }
        // What they must be, not only alike.
        #expect((try? answers[0].get())??.size == 6)  // "theirs"
        #expect((try? answers[1].get()) == .some(nil))  // removed since
        #expect((try? answers[2].get())??.name == "b.txt")
        #expect((try? answers[3].get())??.size == 12)  // the conflict's own contents
        #expect((try? answers[4].get())??.size == 4)
        #expect((try? answers[5].get()) == .some(nil))
        #expect(throws: DocumentStoreError.self) { try answers[6].get() }
        #expect((try? answers[7].get())??.kind == .directory)
        #expect((try? answers[8].get())??.name == "b.txt")  // still there in the conflict version

        // More lookups than one statement takes come back whole and in order.
        let many = (0..<4_500).map { NodeLookup($0 % 2 == 0 ? a : b, at: $0 % 3 == 0 ? v2.version.id : nil) }
        let manyAnswers = try store.nodes(many)
        #expect(manyAnswers.count == many.count)
        for (index, answer) in manyAnswers.enumerated() {
            let expected: String? = index % 2 == 0 ? "a.txt" : (index % 3 == 0 ? "b.txt" : nil)
            #expect((try? answer.get())??.name == expected, "lookup \(index)")
        }
    }

    @Test(
        "A save is validated: unique names, existing directory parents, no root removal",
        arguments: StoreKind.everyBackend)
    static func invalidSaves(_ kind: StoreKind) throws { try Self(kind).invalidSaves() }
    func invalidSaves() throws {
        let doc = try store.createDocument(
            named: "I.pkg", kind: .package, type: nil, permissions: nil, origin: "")
        let (a, saved) = try addFile("a.txt", Data("a".utf8), to: doc)
        let id = try store.makeNodeIDs(count: 1)[0]
        var duplicate = DocumentChanges(document: doc.id, base: saved.version.id)
        duplicate.nodes = [
            NodeRecord(
                id: id, document: doc.id, parent: doc.root, name: "a.txt", kind: .regularFile,
                permissions: 0o644)
        ]
        #expect(throws: DocumentStoreError.self) { try store.save(duplicate) }
        var underFile = DocumentChanges(document: doc.id, base: saved.version.id)
        underFile.nodes = [
            NodeRecord(id: id, document: doc.id, parent: a, name: "x", kind: .regularFile, permissions: 0o644)
        ]
        #expect(throws: DocumentStoreError.self) { try store.save(underFile) }
        var dots = DocumentChanges(document: doc.id, base: saved.version.id)
        dots.nodes = [
            NodeRecord(
                id: id, document: doc.id, parent: doc.root, name: "..", kind: .regularFile, permissions: 0o644
            )
        ]
        #expect(throws: DocumentStoreError.self) { try store.save(dots) }
        var root = DocumentChanges(document: doc.id, base: saved.version.id)
        root.removedNodes = [doc.root]
        #expect(throws: DocumentStoreError.self) { try store.save(root) }
        // A failed save changed nothing.
        #expect(try store.document(doc.id).currentVersion == saved.version.id)
        #expect(try store.nodes(of: doc.id).count == 2)
    }

    @Test(
        "Removing a directory removes its subtree; renames and moves are record changes",
        arguments: StoreKind.everyBackend)
    static func treeChanges(_ kind: StoreKind) throws { try Self(kind).treeChanges() }
    func treeChanges() throws {
        let doc = try store.createDocument(
            named: "Tree.pkg", kind: .package, type: nil, permissions: nil, origin: "")
        let ids = try store.makeNodeIDs(count: 2)
        var mkdir = DocumentChanges(document: doc.id, base: doc.currentVersion)
        mkdir.nodes = [
            NodeRecord(
                id: ids[0], document: doc.id, parent: doc.root, name: "Resources", kind: .directory,
                permissions: 0o755),
            NodeRecord(
                id: ids[1], document: doc.id, parent: doc.root, name: "link", kind: .symbolicLink,
                permissions: 0o777, linkTarget: "Resources/x"),
        ]
        try store.save(mkdir)
        let (x, saved) = try addFile("x", Data("x".utf8), to: doc, parent: ids[0])
        #expect(try store.node(ids[1])?.linkTarget == "Resources/x")
        var move = DocumentChanges(document: doc.id, base: saved.version.id)
        var record = try #require(try store.node(x))
        record.parent = doc.root
        record.name = "moved"
        move.nodes = [record]
        let moved = try store.save(move)
        #expect(try store.node(x)?.name == "moved")
        #expect(try contents(x) == Data("x".utf8))
        let (y, withY) = try addFile("y", Data("y".utf8), to: doc, parent: ids[0])
        var remove = DocumentChanges(document: doc.id, base: withY.version.id)
        remove.removedNodes = [ids[0]]
        try store.save(remove)
        #expect(try store.node(ids[0]) == nil && (try store.node(y)) == nil)
        #expect(try store.node(x) != nil)
        #expect(try store.node(y, at: withY.version.id) != nil)
        _ = moved
        #expect(try store.checkIntegrity().isClean)
    }

    @Test(
        "Metadata round-trips exactly: modes, owners, nanosecond times, preferred names, xattrs",
        arguments: StoreKind.everyBackend)
    static func metadata(_ kind: StoreKind) throws { try Self(kind).metadata() }
    func metadata() throws {
        let doc = try store.createDocument(
            named: "M.pkg", kind: .package, type: "com.example.m", permissions: 0o700, origin: "")
        #expect(doc.type == "com.example.m")
        #expect(try store.node(doc.root)?.permissions == 0o700)
        let id = try store.makeNodeIDs(count: 1)[0]
        let time = Timestamp(seconds: 1_700_000_000, nanoseconds: 123_456_789)
        let record = NodeRecord(
            id: id, document: doc.id, parent: doc.root, name: "1__#$!@%!#__image.png",
            preferredName: "image.png",
            kind: .regularFile, permissions: 0o4750, uid: 1234, gid: 5678, modified: time,
            changed: Timestamp(rawValue: time.rawValue + 1), accessed: Timestamp(rawValue: time.rawValue + 2),
            created: Timestamp(rawValue: time.rawValue - 5),
            extendedAttributes: ["user.a": Data([0, 1, 2]), "user.b": Data()])
        var changes = DocumentChanges(document: doc.id, base: doc.currentVersion)
        changes.nodes = [record]
        let saved = try store.save(changes)
        var back = try #require(try store.node(id))
        #expect(back.version == saved.version.id)
        back.version = record.version
        #expect(back == record)
        #expect(abs(time.date.timeIntervalSince1970 - 1_700_000_000.123456789) < 1e-6)
        #expect(abs(Timestamp(time.date).rawValue - time.rawValue) < 1000)  // a Date holds ~0.1 µs
    }

    @Test(
        "Several connections (as several processes) see each other's saves and events",
        arguments: StoreKind.everyBackend)
    static func sharedStore(_ kind: StoreKind) throws { try Self(kind).sharedStore() }
    func sharedStore() throws {
        let other = try fixture.reopen()
        let doc = try store.createDocument(
            named: "Shared.txt", kind: .flat, type: nil, permissions: nil, origin: "app")
        let start = try other.latestEventSequence()
        var changes = DocumentChanges(document: doc.id, base: doc.currentVersion)
        changes.contents[doc.root] = .replace(DataContentsSource(Data("hello".utf8)))
        changes.origin = "app"
        let saved = try store.save(changes)
        #expect(try other.document(doc.id).currentVersion == saved.version.id)
        #expect(try other.readContents(of: doc.root, at: nil, offset: 0, count: 100) == Data("hello".utf8))
        _ = try other.renameDocument(doc.id, to: "Renamed.txt")
        let events = try store.events(after: start - 1)
        #expect(events.map(\.kind) == [.created, .saved, .renamed])
        #expect(events.last?.name == "Renamed.txt")
        #expect(events[1].version == saved.version.id && events[1].origin == "app")
    }

    @Test("The default store lives in docfs's Documents folder (XDG-3)")
    func defaultLocation() {
        let path = SQLiteStore.defaultStorePath(environment: ["HOME": "/home/u", "XDG_DATA_HOME": "/data"])
        #expect(path == "/data/docfs/Documents/Default.docstore")
        let fallback = SQLiteStore.defaultStorePath(environment: [
            "HOME": "/home/u", "XDG_DATA_HOME": "relative",
        ])
        #expect(fallback == "/home/u/.local/share/docfs/Documents/Default.docstore")
    }
}

/// `count` bytes in chunks whose bytes differ from chunk to chunk, generated without storing them:
/// each chunk is filled with one byte value and starts with its own index.
struct DistinctChunks: ContentsSource {
    let count: Int64
    let chunkSize: Int

    func chunk(_ index: Int64) -> Data {
        var data = Data(repeating: UInt8(truncatingIfNeeded: index % 251 + 1), count: chunkSize)
        withUnsafeBytes(of: index.littleEndian) { data.replaceSubrange(0..<8, with: $0) }
        return data
    }

    func read(offset: Int64, count: Int) throws -> Data {
        let end = min(self.count, offset + Int64(count))
        var result = Data()
        var position = offset
        while position < end {
            let index = position / Int64(chunkSize)
            let start = Int(position - index * Int64(chunkSize))
            let take = Int(min(end - position, Int64(chunkSize - start)))
            result.append(chunk(index)[start..<start + take])
            position += Int64(take)
        }
        return result
    }
}

/// Observing a store from another connection, as another process would.
@Suite struct StoreObserverTests {
    @Test(
        "An observer sees another connection's saves, renames and deletions within a second",
        arguments: StoreKind.everyBackend)
    func observer(_ kind: StoreKind) async throws {
        let fixture = try StoreFixture(kind)
        let writer = fixture.store
        let reader = try fixture.reopen()
        let seen = Locked<[StoreEvent]>([])
        let observer = try StoreObserver(store: reader, interval: .milliseconds(20)) { events in
            seen.withLock { $0 += events }
        }
        defer { observer.stop() }
        let doc = try writer.createDocument(
            named: "a.txt", kind: .flat, type: nil, permissions: nil, origin: "app")
        var changes = DocumentChanges(document: doc.id, base: doc.currentVersion)
        changes.contents[doc.root] = .replace(DataContentsSource(Data("x".utf8)))
        try writer.save(changes)
        _ = try writer.renameDocument(doc.id, to: "b.txt")
        try writer.deleteDocument(doc.id, origin: "app")
        let deadline = ContinuousClock.now + .seconds(1)
        while seen.withLock({ $0.count }) < 4 && ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(10))
        }
        #expect(seen.withLock { $0.map(\.kind) } == [.created, .saved, .renamed, .deleted])
        #expect(seen.withLock { $0.map(\.document) }.allSatisfy { $0 == doc.id })
    }

    @Test("changes() streams events as an AsyncSequence", arguments: StoreKind.everyBackend)
    func stream(_ kind: StoreKind) async throws {
        let fixture = try StoreFixture(kind)
        let store = fixture.store
        let stream = try store.changes(interval: .milliseconds(20))
        _ = try store.createDocument(named: "n.txt", kind: .flat, type: nil, permissions: nil, origin: "")
        var iterator = stream.makeAsyncIterator()
        let event = await iterator.next()
        #expect(event?.kind == .created && event?.name == "n.txt")
    }
}

/// Fixes from review: retention granularity and incremental restore.
@Suite struct StoreRetentionDetailTests {
    @Test(
        "keepFor honours fractions of a second; restore reads only files that differ",
        arguments: StoreKind.everyBackend)
    func details(_ kind: StoreKind) throws {
        let fixture = try StoreFixture(kind)
        let store = fixture.store
        let doc = try store.createDocument(
            named: "R.pkg", kind: .package, type: nil, permissions: nil, origin: "")
        let ids = try store.makeNodeIDs(count: 2)
        var changes = DocumentChanges(document: doc.id, base: doc.currentVersion)
        for (i, id) in ids.enumerated() {
            changes.nodes.append(
                NodeRecord(
                    id: id, document: doc.id, parent: doc.root, name: "f\(i)", kind: .regularFile,
                    permissions: 0o644))
            changes.contents[id] = .replace(DataContentsSource(sampleBytes(300_000, seed: UInt64(i))))
        }
        let v1 = try store.save(changes)
        var edit = DocumentChanges(document: doc.id, base: v1.version.id)
        edit.contents[ids[0]] = .replace(DataContentsSource(Data("small".utf8)))
        try store.save(edit)
        fixture.purgeCache()
        let before = store.statistics.bytesRead
        let restored = try store.restore(v1.version.id, of: doc.id, origin: "test")
        // f1 did not change: not read. f0 is read from v1 (300,000 bytes) and compared.
        #expect(store.statistics.bytesRead - before <= 300_000 + Int64(store.chunkSize))
        #expect(restored.bytesWritten == 0)  // v1's chunks are still stored
        #expect(try store.readContents(of: ids[0], at: nil, offset: 0, count: 10) == sampleBytes(10, seed: 0))

        // A 1.5 s horizon keeps versions younger than 1.5 s.
        let report = try store.collectGarbage(RetentionPolicy(keepLast: 1, keepFor: .milliseconds(1500)))
        #expect(report.versionsRemoved == 0)
    }
}

@Suite struct StoreObserverLifetimeTests {
    @Test(
        "An observer nobody stops is freed with its last owner, and lets its store go",
        arguments: StoreKind.everyBackend)
    func freedWithoutStop(_ kind: StoreKind) async throws {
        let tmp = try TemporaryDirectory()
        let database = kind == .postgres ? try StoreFixture.newDatabase() : nil
        defer { if let database { try? PostgresStore.dropDatabase(database) } }
        weak var weakStore: (any DocumentStore)?
        weak var weakObserver: StoreObserver?
        do {
            let store: any DocumentStore =
                if let database {
                    try PostgresStore(configuration: database, options: .create)
                } else {
                    try SQLiteStore(path: tmp.path("L.docstore"), options: .create)
                }
            let observer = try StoreObserver(store: store, interval: .milliseconds(10)) { _ in }
            weakStore = store
            weakObserver = observer
        }
        // A notifying store's observer wakes at least every notifiedPollInterval.
        let deadline = ContinuousClock.now + .seconds(2) + StoreObserver.notifiedPollInterval
        while (weakObserver != nil || weakStore != nil) && ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(10))
        }
        #expect(weakObserver == nil)
        #expect(weakStore == nil)
    }
}
