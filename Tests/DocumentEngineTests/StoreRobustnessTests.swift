import CLinuxSupport
import Foundation
import GRDB
import StoreTestSupport
import TestSupport
import Testing

@testable import DocumentEngine
@testable import SQLiteStore
@testable import VersionedStore

#if canImport(Glibc)
    import Glibc
#endif

/// SQLiteStore against damaged and foreign files, SIGKILL mid-save, integrity checking and
/// retention.
@Suite struct StoreRobustnessTests {
    // MARK: Files that are not (healthy) stores

    /// The error opening `path` throws, or nil if it opens.
    func openError(_ path: String) -> DocumentStoreError? {
        do {
            _ = try SQLiteStore(path: path)
            return nil
        } catch let error as DocumentStoreError {
            return error
        } catch {
            Issue.record("opening \(path) threw \(type(of: error)), not a DocumentStoreError: \(error)")
            return nil
        }
    }

    func expectNotAStore(
        _ path: String, mentioning words: String, sourceLocation: SourceLocation = #_sourceLocation
    ) {
        let error = openError(path)
        guard case .notAStore(let reportedPath, let reason) = error else {
            Issue.record(
                "expected notAStore, got \(String(describing: error))", sourceLocation: sourceLocation)
            return
        }
        #expect(reportedPath == path, sourceLocation: sourceLocation)
        #expect(reason.contains(words), "\(reason)", sourceLocation: sourceLocation)
        #expect(error?.description.contains(path) == true, sourceLocation: sourceLocation)
    }

    /// A healthy store of a few documents, checkpointed into its file and closed.
    func makeStoreFile(_ path: String, documents: Int = 3) throws {
        let store = try SQLiteStore(path: path, options: .create, chunkSize: 16 * 1024)
        for d in 0..<documents {
            let info = try store.createDocument(
                named: "Doc \(d).pkg", kind: .package, type: nil, permissions: nil, origin: "test")
            let tree = FileWrapper(directoryWithFileWrappers: [:])
            for f in 0..<8 {
                tree.addRegularFile(
                    withContents: sampleBytes(40_000 + f * 1_000, seed: UInt64(d * 100 + f)),
                    preferredFilename: "f\(f).bin")
            }
            try store.save(tree, to: info.id, base: info.currentVersion, origin: "test")
        }
        try store.checkpoint()
    }

    @Test func theStoreAndItsLogAreOwnerOnly() throws {
        let tmp = try TemporaryDirectory()
        let path = tmp.path("Private.docstore")
        let store = try SQLiteStore(path: path, options: .create)
        let info = try store.createDocument(
            named: "a.txt", kind: .flat, type: nil, permissions: nil, origin: "test")
        try store.save(
            FileWrapper(regularFileWithContents: Data("x".utf8)), to: info.id, base: info.currentVersion,
            origin: "test")
        for file in [path, path + "-wal", path + "-shm"] {
            let facts = try FileFacts(file)
            #expect(facts.permissions == 0o600, "\(file) has mode \(String(facts.permissions, radix: 8))")
        }
        _ = store
    }

    @Test func savesCommitWithSynchronousFull() throws {
        let tmp = try TemporaryDirectory()
        let path = tmp.path("Full.docstore")
        #expect(try StoreTestTools.writerSynchronous(SQLiteStore(path: path, options: .create)) == 2)
        #expect(try StoreTestTools.writerSynchronous(SQLiteStore(path: path)) == 2, "reopened")
    }

    @Test func whatIsNotAStoreIsRefusedByName() throws {
        let tmp = try TemporaryDirectory()
        expectNotAStore(tmp.path("missing.docstore"), mentioning: "no such file")
        #expect(
            !FileManager.default.fileExists(atPath: tmp.path("missing.docstore")),
            "not created without .create")

        try tmp.write("empty.docstore", Data())
        expectNotAStore(tmp.path("empty.docstore"), mentioning: "empty")

        try tmp.write("text.docstore", "Dear diary, today I opened a text file as a database.\n")
        expectNotAStore(tmp.path("text.docstore"), mentioning: "not an SQLite database")

        try tmp.mkdir("folder.docstore")
        expectNotAStore(tmp.path("folder.docstore"), mentioning: "not a regular file")
    }

    @Test func anotherApplicationsDatabaseIsRefusedAndLeftAlone() throws {
        let tmp = try TemporaryDirectory()
        for (name, setup) in [
            ("rollback.db", ""),
            ("wal.db", "PRAGMA journal_mode=WAL;"),
        ] {
            let path = tmp.path(name)
            try StoreTestTools.sqlite(
                path,
                setup
                    + "CREATE TABLE recipes(name TEXT, minutes INTEGER); INSERT INTO recipes VALUES ('soup', 30);"
            )
            let before = try Data(contentsOf: URL(fileURLWithPath: path))
            expectNotAStore(path, mentioning: "another application")
            #expect(try StoreTestTools.sqlite(path, "SELECT name FROM recipes;") == "soup")
            let unchanged = try Data(contentsOf: URL(fileURLWithPath: path)) == before
            #expect(unchanged, "\(name) is not modified")
        }
    }

    @Test func aTruncatedStoreIsReportedDamaged() throws {
        let tmp = try TemporaryDirectory()
        let path = tmp.path("Whole.docstore")
        try makeStoreFile(path)
        let whole = try Data(contentsOf: URL(fileURLWithPath: path))
        #expect(whole.count > 200_000)

        try tmp.write("Fifty.docstore", whole.prefix(50))
        guard case .corrupt(_, let reason) = openError(tmp.path("Fifty.docstore")) else {
            Issue.record("a 50-byte store must be reported damaged")
            return
        }
        #expect(reason.contains("truncated"))

        try tmp.write("Half.docstore", whole.prefix(whole.count / 2))
        try expectDamageFound(tmp.path("Half.docstore"))
    }

    @Test func garbageOverPagesInTheMiddleIsFound() throws {
        let tmp = try TemporaryDirectory()
        let path = tmp.path("Garbage.docstore")
        try makeStoreFile(path)
        var bytes = try Data(contentsOf: URL(fileURLWithPath: path))
        let start = bytes.count * 3 / 10 / 4096 * 4096
        let garbage = sampleBytes(bytes.count * 3 / 10, seed: 99)
        bytes.replaceSubrange(start..<start + garbage.count, with: garbage)
        try bytes.write(to: URL(fileURLWithPath: path))
        try expectDamageFound(path)
    }

    /// Opening fails with `.corrupt`, or the integrity check throws `.corrupt` or reports problems.
    func expectDamageFound(_ path: String, sourceLocation: SourceLocation = #_sourceLocation) throws {
        let store: SQLiteStore
        do { store = try SQLiteStore(path: path) } catch let error as DocumentStoreError {
            guard case .corrupt(let reported, _) = error else {
                Issue.record("expected corrupt, got \(error)", sourceLocation: sourceLocation)
                return
            }
            #expect(reported == path, sourceLocation: sourceLocation)
            print("\(path): refused: \(error)")
            return
        }
        do {
            let report = try store.checkIntegrity()
            #expect(!report.isClean, "the damage must be found", sourceLocation: sourceLocation)
            print("\(path): \(report.problems.prefix(3))")
        } catch let error as DocumentStoreError {
            guard case .corrupt = error else {
                Issue.record("expected corrupt, got \(error)", sourceLocation: sourceLocation)
                return
            }
        }
        // Reading what is left may fail, but only with errors.
        for info in (try? store.documents()) ?? [] {
            if let tree = try? store.fileWrapper(for: info.id) {
                for child in (tree.fileWrappers ?? [:]).values { _ = try? child.contents() }
            }
        }
    }

    @Test func aNewerFormatIsRefused() throws {
        let tmp = try TemporaryDirectory()
        let path = tmp.path("Future.docstore")
        try makeStoreFile(path, documents: 1)
        try StoreTestTools.sqlite(path, "UPDATE store_meta SET value = 99 WHERE key = 'format';")
        let error = openError(path)
        #expect(error == .newerFormat(path: path, found: 99, supported: SQLiteSchema.formatVersion))
        #expect(error?.description.contains("upgrade DocFS") == true)
        #expect(try StoreTestTools.sqlite(path, "SELECT value FROM store_meta WHERE key = 'format';") == "99")

        // A migration this program does not know is refused too.
        try StoreTestTools.sqlite(
            path,
            "UPDATE store_meta SET value = 1 WHERE key = 'format'; INSERT INTO grdb_migrations VALUES ('v99');"
        )
        guard case .newerFormat = openError(path) else {
            Issue.record("an unknown migration must be refused")
            return
        }
    }

    // MARK: Integrity check

    @Test(arguments: StoreKind.all) func integrityFindsCorruptAndMissingChunks(_ kind: StoreKind) throws {
        let fixture = try StoreFixture(kind, chunkSize: 32 * 1024)
        let store = fixture.store
        let info = try store.createDocument(
            named: "Doc.pkg", kind: .package, type: nil, permissions: nil, origin: "test")
        var version = info.currentVersion
        for round in 0..<30 {
            let tree = try store.fileWrapper(for: info.id)
            let name = "file\(round % 7).bin"
            if let old = tree.fileWrappers?[name] { tree.removeFileWrapper(old) }
            tree.addRegularFile(
                withContents: sampleBytes(20_000 + round * 3_000, seed: UInt64(round)),
                preferredFilename: name)
            if round % 5 == 4, let gone = tree.fileWrappers?["file\((round + 3) % 7).bin"] {
                tree.removeFileWrapper(gone)
            }
            version = try store.save(tree, to: info.id, base: version, origin: "test").version.id
        }
        _ = try store.collectGarbage(RetentionPolicy(keepLast: 10, keepFor: .zero))
        let healthy = try store.checkIntegrity()
        #expect(healthy.isClean, "\(healthy.problems)")
        #expect(healthy.documentsChecked == 1)
        #expect(healthy.chunksChecked > 30)
        #expect(healthy.nodesChecked >= 7)

        let ids = try fixture.sql("SELECT id FROM chunks ORDER BY id LIMIT 2 OFFSET 5;").split(
            separator: "\n")
        #expect(ids.count == 2)
        let (damaged, removed) = (String(ids[0]), String(ids[1]))
        // Other bytes of the same length, so that only the hash disagrees.
        let random =
            kind == .sqlite
            ? "randomblob(size)"
            : "substring(decode(repeat(md5(random()::text), (size / 16 + 1)::int), 'hex') from 1 for size::int)"
        try fixture.sql("UPDATE chunks SET data = \(random) WHERE id = \(damaged);")
        try fixture.sql("DELETE FROM chunks WHERE id = \(removed);")
        let report = try store.checkIntegrity()
        #expect(
            report.problems.contains("chunk \(damaged): its bytes do not match its hash"),
            "\(report.problems)")
        #expect(report.problems.contains("a file refers to missing chunk \(removed)"), "\(report.problems)")
        #expect(report.problems.count == 2, "\(report.problems)")
    }

    // MARK: Retention

    /// The chunks (non-zero, distinct) that `files` need at `chunkSize`.
    /// The chunks a store cuts these files into (content-defined, as a whole-file save does),
    /// holes left out.
    func chunks(of files: [String: Data], chunkSize: Int) -> Set<Data> {
        var result: Set<Data> = []
        for data in files.values {
            var chunking = Chunking(
                Chunking.Policy(chunkSize: chunkSize).method(forSize: Int64(data.count)), startingAt: 0)
            var offset = 0
            while let chunk = try? chunking.next(read: { count in
                let piece = data.subdata(in: offset..<min(data.count, offset + count))
                offset += piece.count
                return piece
            }) {
                if chunk.contains(where: { $0 != 0 }) { result.insert(chunk) }
            }
        }
        return result
    }

    /// Every regular file of a document at `version`, by path.
    func files(_ store: any DocumentStore, _ document: DocumentID, at version: VersionID) throws -> [String:
        Data]
    {
        var result: [String: Data] = [:]
        func visit(_ wrapper: FileWrapper, _ path: String) throws {
            if wrapper.isRegularFile { result[path] = try wrapper.contents() }
            for (key, child) in try (wrapper.isDirectory ? wrapper.children() : [:]) {
                try visit(child, path.isEmpty ? key : path + "/" + key)
            }
        }
        try visit(store.fileWrapper(for: document, at: version), "")
        return result
    }

    @Test(arguments: StoreKind.all) func garbageCollectionKeepsTheLastVersionsExactly(_ kind: StoreKind)
        throws
    {
        let fixture = try StoreFixture(kind, chunkSize: 16 * 1024)
        let store = fixture.store
        let info = try store.createDocument(
            named: "Doc.pkg", kind: .package, type: nil, permissions: nil, origin: "test")
        var version = info.currentVersion
        var log = Data()
        for save in 1...10 {
            let tree = try store.fileWrapper(for: info.id)
            for name in tree.fileWrappers?.keys.sorted() ?? [] where name != "stable.bin" {
                if let child = tree.fileWrappers?[name] { tree.removeFileWrapper(child) }
            }
            if tree.fileWrappers?["stable.bin"] == nil {
                tree.addRegularFile(
                    withContents: sampleBytes(50_000, seed: 1), preferredFilename: "stable.bin")
            }
            log.append(sampleBytes(7_000, seed: UInt64(1000 + save)))
            tree.addRegularFile(withContents: log, preferredFilename: "growing.log")
            tree.addRegularFile(
                withContents: sampleBytes(40_000, seed: UInt64(save)), preferredFilename: "changing.bin")
            tree.addRegularFile(
                withContents: Data(count: 20_000) + sampleBytes(100, seed: 7),
                preferredFilename: "sparse-\(save).bin")
            version = try store.save(tree, to: info.id, base: version, origin: "save \(save)").version.id
        }
        let all = try store.versions(of: info.id)
        #expect(all.count == 11)
        var before: [VersionID: [String: Data]] = [:]
        for v in all { before[v.id] = try files(store, info.id, at: v.id) }
        let counted = try fixture.sql("SELECT COUNT(*), SUM(size) FROM chunks;").split(
            separator: "|")
        let (chunksBefore, bytesBefore) = (Int(counted[0]) ?? -1, Int64(counted[1]) ?? -1)

        let report = try store.collectGarbage(RetentionPolicy(keepLast: 3, keepFor: .zero))
        let kept = try store.versions(of: info.id)
        #expect(kept.map(\.id) == all.suffix(3).map(\.id))
        #expect(report.versionsRemoved == 8)
        #expect(report.documentsRemoved == 0)
        for v in kept {
            #expect(try files(store, info.id, at: v.id) == before[v.id], "\(v.id) reads as before")
        }
        for v in all.prefix(8) {
            #expect(throws: DocumentStoreError.noSuchVersion(v.id)) {
                try store.fileWrapper(for: info.id, at: v.id)
            }
        }

        let needed = kept.reduce(into: Set<Data>()) {
            $0.formUnion(chunks(of: before[$1.id] ?? [:], chunkSize: store.chunkSize))
        }
        let countedAfter = try fixture.sql("SELECT COUNT(*), SUM(size) FROM chunks;").split(
            separator: "|")
        let (chunksAfter, bytesAfter) = (Int(countedAfter[0]) ?? -1, Int64(countedAfter[1]) ?? -1)
        print(
            "retention: chunks \(chunksBefore) → \(chunksAfter) (\(bytesBefore) → \(bytesAfter) bytes); report \(report)"
        )
        #expect(chunksAfter == needed.count, "exactly the chunks the kept versions use remain")
        #expect(bytesAfter == needed.reduce(0) { $0 + Int64($1.count) })
        #expect(report.chunksRemoved == chunksBefore - chunksAfter)
        #expect(report.bytesFreed == bytesBefore - bytesAfter)
        #expect(report.chunksRemoved > 0)
        #expect(try store.checkIntegrity().isClean)

        // Once more changes nothing.
        let again = try store.collectGarbage(RetentionPolicy(keepLast: 3, keepFor: .zero))
        #expect(again == CollectionReport())
    }

    @Test(arguments: StoreKind.all) func deletedDocumentsGoAfterTheirTime(_ kind: StoreKind) throws {
        let fixture = try StoreFixture(kind)
        let store = fixture.store
        var ids: [DocumentID] = []
        for (i, name) in ["Old.txt", "Recent.txt"].enumerated() {
            let info = try store.createDocument(
                named: name, kind: .flat, type: nil, permissions: nil, origin: "test")
            try store.save(
                FileWrapper(regularFileWithContents: sampleBytes(100_000, seed: UInt64(i))), to: info.id,
                base: info.currentVersion, origin: "test")
            ids.append(info.id)
        }
        try store.deleteDocument(ids[0], origin: "test")
        Thread.sleep(forTimeInterval: 3.3)
        try store.deleteDocument(ids[1], origin: "test")

        // 3 s: the second deletion stays unexpired even if a busy machine stalls this test for
        // a while between it and the collection (1 s was seen to be too short under load).
        let report = try store.collectGarbage(RetentionPolicy(keepLast: 3, keepFor: .seconds(3)))
        #expect(report.documentsRemoved == 1)
        #expect(report.chunksRemoved >= 1 && report.bytesFreed == 100_000, "the old document's content")
        #expect(try store.deletedDocuments().map(\.id) == [ids[1]])
        #expect(throws: DocumentStoreError.self) { try store.document(ids[0]) }
        let restored = try store.undeleteDocument(ids[1], as: nil)
        #expect(restored.name == "Recent.txt")
        #expect(try store.fileWrapper(for: ids[1]).contents() == sampleBytes(100_000, seed: 1))
        #expect(try store.checkIntegrity().isClean)
    }

    // MARK: SIGKILL mid-save

    /// The files of a store-torture round: kept in step with Sources/store-torture/main.swift.
    enum TortureContents {
        static let fileCount = 20

        static func place(_ index: Int) -> (inSub: Bool, name: String) {
            (index >= 10, String(format: "f%02d.bin", index))
        }

        static func contents(round: Int, index: Int) -> Data {
            let size = index % 7 == 0 ? 300_000 : 1_000 + index * 517
            var bytes = Array("round \(round) file \(index)\n".utf8)
            bytes.reserveCapacity(size)
            var state = UInt64(truncatingIfNeeded: round) &* 0x9E37_79B9_7F4A_7C15 &+ UInt64(index)
            while bytes.count < size {
                state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
                var word = state
                for _ in 0..<min(8, size - bytes.count) {
                    bytes.append(UInt8(truncatingIfNeeded: word))
                    word >>= 8
                }
            }
            return Data(bytes)
        }

        static func round(of data: Data) -> Int? {
            // The header is text; the bytes after it are not.
            guard let end = data.prefix(64).firstIndex(of: 0x0A),
                let line = String(data: data[data.startIndex..<end], encoding: .utf8),
                line.hasPrefix("round ")
            else { return nil }
            return Int(line.dropFirst(6).split(separator: " ").first ?? "")
        }
    }

    /// The store-torture program, built next to the test bundle by `swift build --build-tests`.
    static func tortureProgram() -> URL? {
        let candidates = [
            URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent(),
            Bundle.main.bundleURL,
            Bundle.main.bundleURL.deletingLastPathComponent(),
        ]
        return candidates.map { $0.appendingPathComponent("store-torture") }.first {
            FileManager.default.isExecutableFile(atPath: $0.path)
        }
    }

    /// The round the document is at, after checking that every file belongs to it.
    func verifiedRound(_ store: any DocumentStore, document: String) throws -> Int {
        let report = try store.checkIntegrity()
        #expect(report.isClean, "\(report.problems)")
        let info = try #require(try store.document(named: document))
        let tree = try store.fileWrapper(for: info.id)
        guard let first = tree.fileWrappers?["f00.bin"] else {
            #expect(tree.fileWrappers?.isEmpty == true, "no files, or all of one round")
            return 0
        }
        let round = try #require(TortureContents.round(of: try first.readContents(offset: 0, count: 64)))
        for index in 0..<TortureContents.fileCount {
            let (inSub, name) = TortureContents.place(index)
            let folder = inSub ? tree.fileWrappers?["sub"] : tree
            let data = try folder?.fileWrappers?[name]?.contents()
            #expect(
                data == TortureContents.contents(round: round, index: index),
                "file \(index) belongs to round \(round)")
        }
        return round
    }

    /// On PostgreSQL the kill drops the connection mid-transaction: the server rolls it back.
    @Test(.timeLimit(.minutes(2)), arguments: StoreKind.all)
    func aKilledSaveLosesNothingAcknowledged(_ kind: StoreKind) throws {
        try killSavesMidway(kind, mode: nil, iterations: 25)
    }

    /// The same through the engine's `Document` (an app saving a package document with
    /// `save(to:for:)`), killed mid-save.
    @Test(.timeLimit(.minutes(2)), arguments: StoreKind.all)
    func aKilledDocumentSaveLosesNothingAcknowledged(_ kind: StoreKind) throws {
        try killSavesMidway(kind, mode: "document", iterations: 15)
    }

    /// Safe-saves at a mount's root, as the mount commits them (a replacing rename of documents
    /// in one transaction), and exchanges of two documents' names, killed at random: the name
    /// always holds a whole round, at least the last acknowledged one, and both exchanged names
    /// are always there.
    @Test(.timeLimit(.minutes(2)), arguments: StoreKind.all)
    func aKilledRenameLosesNoName(_ kind: StoreKind) throws {
        let setUp: (any DocumentStore, String) throws -> Void = { store, document in
            for side in ["a", "b"] {
                let info = try store.createDocument(
                    named: "\(document).\(side)", kind: .flat, type: nil, permissions: nil, origin: "test")
                var changes = DocumentChanges(document: info.id, base: info.currentVersion)
                changes.contents[info.root] = .replace(DataContentsSource(Data(side.utf8)))
                _ = try store.save(changes)
            }
        }
        try killSavesMidway(kind, mode: "names", iterations: 25, setUp: setUp) { store, document in
            let report = try store.checkIntegrity()
            #expect(report.isClean, "\(report.problems)")
            let live = try store.documents()
            let a = live.first { $0.name == document + ".a" }
            let b = live.first { $0.name == document + ".b" }
            #expect(a != nil && b != nil && a?.id != b?.id, "both exchanged names are there")
            let sides = try [a, b].compactMap { $0 }.map { info in
                String(
                    decoding: try store.readContents(of: info.root, at: nil, offset: 0, count: 8),
                    as: UTF8.self)
            }
            #expect(Set(sides) == ["a", "b"], "each exchanged document keeps its own bytes")
            let temporaries = live.filter { $0.name.hasPrefix(document + ".tmp-") }
            #expect(temporaries.count <= 1, "at most the save in flight left its temporary document")
            guard let info = live.first(where: { $0.name == document }) else { return 0 }
            let data = try store.readContents(of: info.root, at: nil, offset: 0, count: 1 << 20)
            let round = try #require(TortureContents.round(of: data))
            #expect(data == TortureContents.contents(round: round, index: round % TortureContents.fileCount))
            return round
        }
    }

    /// Starts store-torture (in `mode`) `iterations` times and kills it with SIGKILL after a
    /// seeded delay of 5–400 ms; after each kill the store is clean, holds one whole round, at
    /// least the last acknowledged one, and never goes back (`verify` says which round the
    /// store holds; by default, the package document's).
    func killSavesMidway(
        _ kind: StoreKind, mode: String?, iterations: Int,
        setUp: ((any DocumentStore, String) throws -> Void)? = nil,
        verify: ((any DocumentStore, String) throws -> Int)? = nil
    ) throws {
        guard let program = Self.tortureProgram() else {
            Issue.record(
                "store-torture is not built next to the tests; run `swift build --build-tests` first")
            return
        }
        // Created up front: a kill while the store itself is being created is another matter.
        let fixture = try StoreFixture(kind, name: "Torture")
        let path = fixture.location
        let document = "Torture.pkg"
        if let setUp {
            try setUp(fixture.store, document)
        } else {
            _ = try fixture.store.createDocument(
                named: document, kind: .package, type: nil, permissions: nil, origin: "test")
        }
        let seed =
            ProcessInfo.processInfo.environment["STORE_TORTURE_SEED"].flatMap { UInt64($0) }
            ?? UInt64.random(in: 1...999_999)
        var random = SplitMix64(seed: seed)
        // A PostgreSQL save takes longer (round trips to the server): spread the kills wider.
        let scale = kind == .postgres ? 3 : 1
        var delays = (0..<iterations).map { i in
            (5 + i * 395 / (iterations - 1) + Int(random.next() % 10)) * scale
        }
        delays.shuffle(using: &random)
        print(
            "store-torture \(mode ?? "store") on \(kind): seed \(seed) (set STORE_TORTURE_SEED to repeat), delays in ms \(delays)"
        )

        var lastRound = 0
        var acknowledged = 0
        var killedWhileSaving = 0
        let clock = ContinuousClock()
        let started = clock.now
        // A loaded machine can take longer than the longest delay to start the child: then
        // later kills wait longer, until one comes after a save.
        var extra = [2000, 5000, 10000][...]
        var iteration = -1
        while true {
            iteration += 1
            let delay: Int
            if iteration < delays.count {
                delay = delays[iteration]
            } else if acknowledged == 0, let longer = extra.popFirst() {
                delay = longer
            } else {
                break
            }
            let child = Process()
            child.executableURL = program
            child.arguments = [path, document, "100000"] + (mode.map { [$0] } ?? [])
            let output = Pipe()
            child.standardOutput = output
            child.standardError = FileHandle.nullDevice
            try child.run()
            usleep(UInt32(delay * 1000))
            kill(child.processIdentifier, SIGKILL)
            child.waitUntilExit()
            let printed = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            let saved = printed.split(separator: "\n").compactMap { line in
                line.hasPrefix("saved ") ? Int(line.dropFirst(6)) : nil
            }
            let lastSaved = saved.last ?? 0
            if !saved.isEmpty { killedWhileSaving += 1 }
            let reopened = try fixture.reopen()
            let round =
                try verify.map { try $0(reopened, document) } ?? verifiedRound(reopened, document: document)
            print(
                "iteration \(iteration): killed after \(delay) ms, \(saved.count) saves acknowledged (last \(lastSaved)), store at round \(round)"
            )
            #expect(
                round >= lastSaved, "an acknowledged save was lost (seed \(seed), iteration \(iteration))")
            #expect(round >= lastRound, "the store went back in time (seed \(seed), iteration \(iteration))")
            // At most the save in flight committed without being acknowledged.
            #expect(round <= max(lastSaved, lastRound) + 1)
            lastRound = max(lastRound, round)
            acknowledged += saved.count
        }
        print(
            "store-torture: \(acknowledged) saves acknowledged, \(killedWhileSaving) kills after the first save, \(clock.now - started)"
        )
        #expect(acknowledged > 0, "the child never saved: it was killed too early every time")
    }
}

/// Helpers of the store tests: the sqlite3 command, file facts, xattrs and times.
enum StoreTestTools {
    /// Runs `sql` with the sqlite3 command on `path`; returns its output without the last newline.
    @discardableResult
    static func sqlite(_ path: String, _ sql: String) throws -> String {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/sqlite3")
        process.arguments = ["-bail", path, sql]
        let output = Pipe()
        let errors = Pipe()
        process.standardOutput = output
        process.standardError = errors
        try process.run()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        let message = errors.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else {
            throw DocumentStoreError.io("sqlite3 \(sql): \(String(decoding: message, as: UTF8.self))")
        }
        var text = String(decoding: data, as: UTF8.self)
        if text.hasSuffix("\n") { text.removeLast() }
        return text
    }

    /// The `synchronous` level the store's writer connection commits with (2 FULL, 1 NORMAL).
    static func writerSynchronous(_ store: SQLiteStore) throws -> Int {
        try store.pool.writeWithoutTransaction { try Int.fetchOne($0, sql: "PRAGMA synchronous") } ?? -1
    }

    static func fileSize(_ path: String) -> Int64 {
        var st = stat()
        return lstat(path, &st) == 0 ? Int64(st.st_size) : 0
    }

    /// The bytes of an SQLite store: its file, its log and its packs.
    static func sqliteStoreBytes(_ path: String) -> Int64 {
        let packs = path + "-packs"
        let names = (try? FileManager.default.contentsOfDirectory(atPath: packs)) ?? []
        return fileSize(path) + fileSize(path + "-wal") + names.reduce(0) { $0 + fileSize(packs + "/" + $1) }
    }

    static func setXattr(_ path: String, _ name: String, _ value: Data) throws {
        let result = value.withUnsafeBytes { raw in lsetxattr(path, name, raw.baseAddress, raw.count, 0) }
        if result != 0 { throw POSIXError(.init(rawValue: errno) ?? .EIO) }
    }

    /// The `user.` extended attributes of `path` (not following links).
    static func xattrs(_ path: String) -> [String: Data] {
        let size = llistxattr(path, nil, 0)
        guard size > 0 else { return [:] }
        var names = [CChar](repeating: 0, count: size)
        let n = llistxattr(path, &names, size)
        guard n > 0 else { return [:] }
        var result: [String: Data] = [:]
        for raw in names[0..<n].split(separator: 0) {
            let name = String(decoding: raw.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            guard name.hasPrefix("user.") else { continue }
            let length = lgetxattr(path, name, nil, 0)
            guard length >= 0 else { continue }
            var value = Data(count: length)
            let got = value.withUnsafeMutableBytes { lgetxattr(path, name, $0.baseAddress, length) }
            result[name] = value.prefix(max(0, got))
        }
        return result
    }

    static func setTimes(_ path: String, seconds: Int, nanoseconds: Int) throws {
        var times = [
            timespec(tv_sec: seconds - 86_400, tv_nsec: nanoseconds),
            timespec(tv_sec: seconds, tv_nsec: nanoseconds),
        ]
        guard utimensat(AT_FDCWD, path, &times, AT_SYMLINK_NOFOLLOW) == 0 else {
            throw POSIXError(.init(rawValue: errno) ?? .EIO)
        }
    }

    /// Every item below `root`, relative to it, parents first.
    static func relativePaths(_ root: String) throws -> [String] {
        var result: [String] = []
        func walk(_ relative: String) throws {
            let path = relative.isEmpty ? root : root + "/" + relative
            for name in try FileManager.default.contentsOfDirectory(atPath: path).sorted() {
                let child = relative.isEmpty ? name : relative + "/" + name
                result.append(child)
                var st = stat()
                if lstat(root + "/" + child, &st) == 0, (st.st_mode & S_IFMT) == S_IFDIR { try walk(child) }
            }
        }
        try walk("")
        return result
    }

    /// Expects `copy` to be `original` exactly: the same items, kinds, bytes, permissions,
    /// modification times to the nanosecond, `user.` xattrs and link destinations.
    static func expectIdentical(
        _ original: String, _ copy: String, sourceLocation: SourceLocation = #_sourceLocation
    ) throws {
        var st = stat()
        let isDirectory = lstat(original, &st) == 0 && (st.st_mode & S_IFMT) == S_IFDIR
        let originalPaths = isDirectory ? try relativePaths(original) : []
        let copyPaths = isDirectory ? try relativePaths(copy) : []
        #expect(originalPaths == copyPaths, sourceLocation: sourceLocation)
        for relative in [""] + originalPaths {
            let a = relative.isEmpty ? original : original + "/" + relative
            let b = relative.isEmpty ? copy : copy + "/" + relative
            var sa = stat()
            var sb = stat()
            guard lstat(a, &sa) == 0, lstat(b, &sb) == 0 else {
                Issue.record("\(relative) is missing", sourceLocation: sourceLocation)
                continue
            }
            let what = relative.isEmpty ? "the top item" : relative
            #expect(
                sa.st_mode == sb.st_mode,
                "\(what): mode \(String(sa.st_mode, radix: 8)) vs \(String(sb.st_mode, radix: 8))",
                sourceLocation: sourceLocation)
            #expect(
                sa.st_mtim.tv_sec == sb.st_mtim.tv_sec && sa.st_mtim.tv_nsec == sb.st_mtim.tv_nsec,
                "\(what): mtime \(sa.st_mtim) vs \(sb.st_mtim)", sourceLocation: sourceLocation)
            #expect(
                sa.st_uid == sb.st_uid && sa.st_gid == sb.st_gid, "\(what): owner",
                sourceLocation: sourceLocation)
            #expect(xattrs(a) == xattrs(b), "\(what): xattrs", sourceLocation: sourceLocation)
            switch sa.st_mode & S_IFMT {
            case S_IFREG:
                let same =
                    try Data(contentsOf: URL(fileURLWithPath: a)) == Data(contentsOf: URL(fileURLWithPath: b))
                #expect(same, "\(what): contents", sourceLocation: sourceLocation)
            case S_IFLNK:
                let da = try FileManager.default.destinationOfSymbolicLink(atPath: a)
                let db = try FileManager.default.destinationOfSymbolicLink(atPath: b)
                #expect(da == db, "\(what): link destination", sourceLocation: sourceLocation)
            default:
                break
            }
        }
    }
}
