import CLinuxSupport
import Foundation
import SQLiteStore
import Synchronization
import TestSupport
import Testing

@testable import DocumentEngine

#if canImport(Glibc)
    import Glibc
#endif

/// The file-wrapper bridge (incremental, lazy) and import/export of a store.
@Suite struct StoreImportExportTests {
    // MARK: File wrappers from and to the store

    /// A package of `count` 1 MB "images", saved through the bridge.
    func makeImageDocument(_ store: SQLiteStore, count: Int) throws -> DocumentInfo {
        let info = try store.createDocument(
            named: "Album.imagenotes", kind: .package, type: nil, permissions: nil, origin: "test")
        let package = FileWrapper(directoryWithFileWrappers: [:])
        for i in 0..<count {
            package.addRegularFile(
                withContents: sampleBytes(1_000_000, seed: UInt64(i)),
                preferredFilename: String(format: "image%03d.png", i))
        }
        package.addRegularFile(
            withContents: Data("{\"title\":\"album\"}".utf8), preferredFilename: "Info.json")
        let result = try store.save(package, to: info.id, base: info.currentVersion, origin: "test")
        #expect(!result.isConflict)
        return try store.document(info.id)
    }

    @Test func replacingOneImageOfAHundredWritesOneImage() throws {
        let tmp = try TemporaryDirectory()
        let path = tmp.path("Album.docstore")
        let info = try makeImageDocument(SQLiteStore(path: path, options: .create), count: 100)

        // A fresh handle: its counters start at zero and its cache is cold.
        let store = try SQLiteStore(path: path)
        let tree = try store.fileWrapper(for: info.id)
        #expect(store.statistics.bytesRead == 0, "listing the tree reads no contents")
        #expect(store.statistics.chunksRead == 0)
        #expect(tree.fileWrappers?.count == 101)
        #expect(tree.fileWrappers?["image042.png"]?.contentsLength == 1_000_000)

        // An unchanged tree writes no contents and no records, and reads nothing either.
        let unchanged = try store.save(tree, to: info.id, base: info.currentVersion, origin: "test")
        #expect(unchanged.bytesWritten == 0)
        #expect(unchanged.chunksWritten == 0)
        #expect(unchanged.nodesWritten == 0)
        #expect(store.statistics.bytesRead == 0)

        // Replace one image: remove the wrapper, add a new one under the same name.
        let old = try #require(tree.fileWrappers?["image042.png"])
        tree.removeFileWrapper(old)
        let replacement = sampleBytes(1_000_000, seed: 4242)
        tree.addRegularFile(withContents: replacement, preferredFilename: "image042.png")
        try store.checkpoint()
        let sizeBefore = StoreTestTools.fileSize(path) + StoreTestTools.fileSize(path + "-wal")
        let result = try store.save(tree, to: info.id, base: unchanged.version.id, origin: "test")
        let walAfter = StoreTestTools.fileSize(path + "-wal")
        let growth = StoreTestTools.fileSize(path) + walAfter - sizeBefore
        print(
            "replace 1 of 100 images: bytesWritten \(result.bytesWritten), chunks \(result.chunksWritten), nodes \(result.nodesWritten), WAL \(walAfter) bytes, db+WAL growth \(growth) bytes"
        )
        #expect(result.bytesWritten <= 1_000_000)
        // Content-defined chunks average half the chunk size; none is longer than it.
        #expect(result.chunksWritten <= 4 * ((1_000_000 + store.chunkSize - 1) / store.chunkSize))
        #expect(result.nodesWritten <= 2, "the image's record and its folder's modification date")
        // Every page the save wrote is in the WAL: one image plus a little metadata, not 100 MB.
        #expect(walAfter < 1_000_000 + 256 * 1024)
        #expect(growth < 1_000_000 + 256 * 1024)
        #expect(store.statistics.bytesRead == 0, "a new wrapper's bytes are compared by hash, not read back")

        // The new version has the new image; the others are untouched and the old version keeps the old one.
        let fresh = try SQLiteStore(path: path)
        let current = try fresh.fileWrapper(for: info.id)
        let image = try #require(current.fileWrappers?["image007.png"])
        #expect(try image.contents() == sampleBytes(1_000_000, seed: 7))
        #expect(fresh.statistics.bytesRead == 1_000_000, "reading one file reads only its chunks")
        #expect(fresh.statistics.chunksRead <= 4 * ((1_000_000 + fresh.chunkSize - 1) / fresh.chunkSize))
        #expect(try current.fileWrappers?["image042.png"]?.contents() == replacement)
        let before = try fresh.fileWrapper(for: info.id, at: info.currentVersion)
        #expect(try before.fileWrappers?["image042.png"]?.contents() == sampleBytes(1_000_000, seed: 42))
        #expect(try fresh.checkIntegrity().isClean)
    }

    @Test func wrappersCarryTheStoredMetadata() throws {
        let tmp = try TemporaryDirectory()
        let store = try SQLiteStore(path: tmp.path("Meta.docstore"), options: .create)
        let info = try store.createDocument(
            named: "Notes.pkg", kind: .package, type: nil, permissions: 0o750, origin: "test")
        let ids = try store.makeNodeIDs(count: 3)
        var changes = DocumentChanges(document: info.id, base: info.currentVersion)
        let mtime = Timestamp(seconds: 1_700_000_000, nanoseconds: 123_456_789)
        changes.nodes = [
            NodeRecord(
                id: ids[0], document: info.id, parent: info.root, name: "2__#$!@%!#__text.txt",
                preferredName: "text.txt",
                kind: .regularFile, permissions: 0o640, uid: 1234, gid: 5678, modified: mtime,
                extendedAttributes: ["user.tag": Data("red".utf8)]),
            NodeRecord(
                id: ids[1], document: info.id, parent: info.root, name: "folder", kind: .directory,
                permissions: 0o700),
            NodeRecord(
                id: ids[2], document: info.id, parent: ids[1], name: "link", kind: .symbolicLink,
                permissions: 0o777,
                linkTarget: "../2__#$!@%!#__text.txt"),
        ]
        changes.contents[ids[0]] = .chunks(size: 5, [0: Data("hello".utf8)])
        let saved = try store.save(changes)

        let tree = try store.fileWrapper(for: info.id)
        #expect(tree.filename == "Notes.pkg")
        #expect(tree.posixPermissions == 0o750)
        let file = try #require(
            tree.fileWrappers?["2__#$!@%!#__text.txt"], "keys are the stored names, not re-uniqued")
        #expect(file.filename == "2__#$!@%!#__text.txt")
        #expect(file.preferredFilename == "text.txt")
        #expect(file.posixPermissions == 0o640)
        #expect(file.modificationDate == mtime.date)
        #expect(file.fileAttributes[.ownerAccountID] as? Int == 1234)
        #expect(file.fileAttributes[.groupOwnerAccountID] as? Int == 5678)
        #expect(file.extendedAttributes == ["user.tag": Data("red".utf8)])
        #expect(
            file.state.withLock { $0.storeOrigin }
                == FileWrapper.StoreOrigin(
                    store: ObjectIdentifier(store), node: ids[0], version: saved.version.id))
        let link = try #require(tree.fileWrappers?["folder"]?.fileWrappers?["link"])
        #expect(try link.symbolicLinkDestination() == "../2__#$!@%!#__text.txt")
        #expect(try file.contents() == Data("hello".utf8))

        // Saved back unchanged: nothing at all is written, and the nanoseconds survive.
        let again = try store.save(tree, to: info.id, base: saved.version.id, origin: "test")
        #expect(again.nodesWritten == 0 && again.bytesWritten == 0)
        #expect(try store.node(ids[0], at: nil)?.modified == mtime)
    }

    @Test func aWrapperShowsTheVersionItWasReadAt() throws {
        let tmp = try TemporaryDirectory()
        let store = try SQLiteStore(path: tmp.path("Pin.docstore"), options: .create)
        let info = try store.createDocument(
            named: "Doc.pkg", kind: .package, type: nil, permissions: nil, origin: "test")
        let tree = FileWrapper(directoryWithFileWrappers: [:])
        tree.addRegularFile(withContents: Data("one".utf8), preferredFilename: "a.txt")
        let first = try store.save(tree, to: info.id, base: info.currentVersion, origin: "test")
        let pinned = try store.fileWrapper(for: info.id)

        let second = try store.fileWrapper(for: info.id)
        let old = try #require(second.fileWrappers?["a.txt"])
        second.removeFileWrapper(old)
        second.addRegularFile(withContents: Data("two".utf8), preferredFilename: "a.txt")
        try store.save(second, to: info.id, base: first.version.id, origin: "test")

        #expect(try pinned.fileWrappers?["a.txt"]?.contents() == Data("one".utf8))
        #expect(try store.fileWrapper(for: info.id).fileWrappers?["a.txt"]?.contents() == Data("two".utf8))
    }

    @Test func movesRenamesAndAttributeChangesWriteRecordsOnly() throws {
        let tmp = try TemporaryDirectory()
        let store = try SQLiteStore(path: tmp.path("Move.docstore"), options: .create)
        let info = try store.createDocument(
            named: "Doc.pkg", kind: .package, type: nil, permissions: nil, origin: "test")
        let tree = FileWrapper(directoryWithFileWrappers: [:])
        let folder = FileWrapper(directoryWithFileWrappers: [:])
        folder.preferredFilename = "a"
        tree.addFileWrapper(folder)
        folder.addRegularFile(withContents: sampleBytes(300_000, seed: 1), preferredFilename: "x.bin")
        tree.addRegularFile(withContents: Data("keep".utf8), preferredFilename: "keep.txt")
        tree.addRegularFile(withContents: Data("gone".utf8), preferredFilename: "gone.txt")
        var version = try store.save(tree, to: info.id, base: info.currentVersion, origin: "test").version.id
        let xID = try #require(store.nodes(of: info.id).first { $0.name == "x.bin" }?.id)

        // Move x.bin into a new folder b, rename keep.txt by its preferred name, chmod it, drop gone.txt.
        let read = try store.fileWrapper(for: info.id)
        let x = try #require(read.fileWrappers?["a"]?.fileWrappers?["x.bin"])
        read.fileWrappers?["a"]?.removeFileWrapper(x)
        let b = FileWrapper(directoryWithFileWrappers: [:])
        b.preferredFilename = "b"
        read.addFileWrapper(b)
        b.addFileWrapper(x)
        let keep = try #require(read.fileWrappers?["keep.txt"])
        keep.preferredFilename = "kept.txt"
        var attributes = keep.fileAttributes
        attributes[.posixPermissions] = 0o600
        keep.fileAttributes = attributes
        read.removeFileWrapper(try #require(read.fileWrappers?["gone.txt"]))
        let result = try store.save(read, to: info.id, base: version, origin: "test")
        version = result.version.id
        #expect(result.bytesWritten == 0, "moved and renamed wrappers keep their chunks")
        #expect(store.statistics.bytesRead == 0, "nor are they read")

        let records = try store.nodes(of: info.id)
        #expect(records.first { $0.name == "x.bin" }?.id == xID, "a moved wrapper keeps its node")
        #expect(records.first { $0.name == "kept.txt" }?.permissions == 0o600)
        #expect(!records.contains { $0.name == "gone.txt" || $0.name == "keep.txt" })
        let again = try store.fileWrapper(for: info.id)
        #expect(
            try again.fileWrappers?["b"]?.fileWrappers?["x.bin"]?.contents() == sampleBytes(300_000, seed: 1))
        #expect(try again.fileWrappers?["kept.txt"]?.contents() == Data("keep".utf8))
        #expect(try store.checkIntegrity().isClean)

        // After the save the wrappers point at the new version, so saving again writes nothing.
        #expect(x.state.withLock { $0.storeOrigin?.version } == version)
        let noop = try store.save(read, to: info.id, base: version, origin: "test")
        #expect(noop.nodesWritten == 0 && noop.bytesWritten == 0)
    }

    @Test func aFlatDocumentIsOneRegularFileWrapper() throws {
        let tmp = try TemporaryDirectory()
        let store = try SQLiteStore(path: tmp.path("Flat.docstore"), options: .create)
        let info = try store.createDocument(
            named: "Note.txt", kind: .flat, type: nil, permissions: nil, origin: "test")
        let first = try store.save(
            FileWrapper(regularFileWithContents: sampleBytes(600_000, seed: 3)), to: info.id,
            base: info.currentVersion,
            origin: "test")
        let read = try store.fileWrapper(for: info.id)
        #expect(read.isRegularFile)
        #expect(read.filename == "Note.txt")
        #expect(try read.contents() == sampleBytes(600_000, seed: 3))

        // Changing one byte in the last chunk writes that chunk only.
        var edited = sampleBytes(600_000, seed: 3)
        edited[599_999] ^= 0xFF
        let second = try store.save(
            FileWrapper(regularFileWithContents: edited), to: info.id, base: first.version.id, origin: "test")
        #expect(second.chunksWritten <= 2)
        #expect(
            second.bytesWritten <= Int64(store.chunkSize), "\(second.bytesWritten) bytes for one changed byte"
        )
        #expect(try store.fileWrapper(for: info.id).contents() == edited)

        #expect(throws: DocumentStoreError.self) {
            try store.save(
                FileWrapper(directoryWithFileWrappers: [:]), to: info.id, base: second.version.id,
                origin: "test")
        }
    }

    @Test func aSaveBasedOnAnOldVersionIsKeptAsAConflict() throws {
        let tmp = try TemporaryDirectory()
        let store = try SQLiteStore(path: tmp.path("Conflict.docstore"), options: .create)
        let info = try store.createDocument(
            named: "Doc.pkg", kind: .package, type: nil, permissions: nil, origin: "test")
        let mine = try store.fileWrapper(for: info.id)
        let theirs = try store.fileWrapper(for: info.id)
        theirs.addRegularFile(withContents: Data("theirs".utf8), preferredFilename: "a.txt")
        let saved = try store.save(theirs, to: info.id, base: info.currentVersion, origin: "them")
        mine.addRegularFile(withContents: Data("mine".utf8), preferredFilename: "a.txt")
        let conflict = try store.save(mine, to: info.id, base: info.currentVersion, origin: "me")
        #expect(conflict.isConflict)
        #expect(
            mine.state.withLock { $0.storeOrigin?.version } == info.currentVersion,
            "a conflict does not adopt")
        #expect(try store.document(info.id).currentVersion == saved.version.id)
        #expect(try store.fileWrapper(for: info.id).fileWrappers?["a.txt"]?.contents() == Data("theirs".utf8))
        #expect(
            try store.fileWrapper(for: info.id, at: conflict.version.id).fileWrappers?["a.txt"]?.contents()
                == Data("mine".utf8))
        #expect(throws: DocumentStoreError.self) {
            try store.save(mine, to: info.id, base: info.currentVersion, origin: "me", conflictPolicy: .fail)
        }
    }

    @Test func movingAWrapperOutOfARemovedFolderKeepsIt() throws {
        let tmp = try TemporaryDirectory()
        let store = try SQLiteStore(path: tmp.path("MoveOut.docstore"), options: .create)
        let info = try store.createDocument(
            named: "Doc.pkg", kind: .package, type: nil, permissions: nil, origin: "test")
        let tree = FileWrapper(directoryWithFileWrappers: [:])
        let folder = FileWrapper(directoryWithFileWrappers: [:])
        folder.preferredFilename = "old"
        tree.addFileWrapper(folder)
        folder.addRegularFile(withContents: Data("survivor".utf8), preferredFilename: "x.txt")
        let first = try store.save(tree, to: info.id, base: info.currentVersion, origin: "test")

        // Two editors start from the first version; one moves x.txt out of "old" and removes it.
        let mine = try store.fileWrapper(for: info.id)
        let theirs = try store.fileWrapper(for: info.id)
        let oldFolder = try #require(mine.fileWrappers?["old"])
        let x = try #require(oldFolder.fileWrappers?["x.txt"])
        mine.removeFileWrapper(oldFolder)
        mine.addFileWrapper(x)
        let saved = try store.save(mine, to: info.id, base: first.version.id, origin: "mine")
        #expect(
            try store.fileWrapper(for: info.id).fileWrappers?["x.txt"]?.contents() == Data("survivor".utf8))
        #expect(try store.fileWrapper(for: info.id).fileWrappers?["old"] == nil)

        // The same change saved as a conflict (based on the first version) must keep x.txt too.
        theirs.addRegularFile(withContents: Data("theirs".utf8), preferredFilename: "t.txt")
        let theirOld = try #require(theirs.fileWrappers?["old"])
        let theirX = try #require(theirOld.fileWrappers?["x.txt"])
        theirs.removeFileWrapper(theirOld)
        theirs.addFileWrapper(theirX)
        let conflict = try store.save(theirs, to: info.id, base: first.version.id, origin: "theirs")
        #expect(conflict.isConflict)
        #expect(try store.document(info.id).currentVersion == saved.version.id)
        let kept = try store.fileWrapper(for: info.id, at: conflict.version.id)
        #expect(try kept.fileWrappers?["x.txt"]?.contents() == Data("survivor".utf8))
    }

    /// SQLiteStore validates new names against wrappers the same save removes.
    @Test func replacingAFileWithAFolderOfTheSameName() throws {
        let tmp = try TemporaryDirectory()
        let store = try SQLiteStore(path: tmp.path("Kind.docstore"), options: .create)
        let info = try store.createDocument(
            named: "Doc.pkg", kind: .package, type: nil, permissions: nil, origin: "test")
        let tree = FileWrapper(directoryWithFileWrappers: [:])
        tree.addRegularFile(withContents: Data("file".utf8), preferredFilename: "item")
        let first = try store.save(tree, to: info.id, base: info.currentVersion, origin: "test")

        let read = try store.fileWrapper(for: info.id)
        read.removeFileWrapper(try #require(read.fileWrappers?["item"]))
        let folder = FileWrapper(directoryWithFileWrappers: [
            "inside.txt": FileWrapper(regularFileWithContents: Data())
        ])
        folder.preferredFilename = "item"
        read.addFileWrapper(folder)
        try store.save(read, to: info.id, base: first.version.id, origin: "test")
        #expect(try store.fileWrapper(for: info.id).fileWrappers?["item"]?.isDirectory == true)
    }

    // MARK: Import and export

    /// A package with nested folders, empty and multi-MiB files, links, odd modes, xattrs and
    /// nanosecond times.
    func makeSourcePackage(_ tmp: TemporaryDirectory) throws -> URL {
        let root = tmp.url("Source/Trip.pkg")
        try tmp.mkdir("Source/Trip.pkg/Photos/Raw")
        try tmp.mkdir("Source/Trip.pkg/Empty Folder")
        try tmp.write("Source/Trip.pkg/Info.plist", "<plist/>")
        try tmp.write("Source/Trip.pkg/empty.txt", Data())
        try tmp.write("Source/Trip.pkg/Photos/big.raw", sampleBytes(3 * 1024 * 1024 + 12_345, seed: 9))
        try tmp.write("Source/Trip.pkg/Photos/Raw/secret.key", sampleBytes(4096, seed: 10))
        try tmp.write("Source/Trip.pkg/Photos/Raw/zeros.bin", Data(count: 600_000))
        #expect(symlink("../Info.plist", tmp.path("Source/Trip.pkg/Photos/info-link")) == 0)
        #expect(symlink("/nonexistent/target", tmp.path("Source/Trip.pkg/dangling")) == 0)
        #expect(chmod(tmp.path("Source/Trip.pkg/Photos/Raw/secret.key"), 0o600) == 0)
        #expect(chmod(tmp.path("Source/Trip.pkg/Photos/Raw"), 0o750) == 0)
        #expect(chmod(tmp.path("Source/Trip.pkg/Info.plist"), 0o444) == 0)
        try StoreTestTools.setXattr(tmp.path("Source/Trip.pkg/Info.plist"), "user.color", Data("blue".utf8))
        try StoreTestTools.setXattr(
            tmp.path("Source/Trip.pkg/Photos/big.raw"), "user.bin", Data([0, 1, 2, 255]))
        try StoreTestTools.setXattr(tmp.path("Source/Trip.pkg/Photos"), "user.empty", Data())
        try StoreTestTools.setXattr(tmp.path("Source/Trip.pkg"), "user.kind", Data("package".utf8))
        // Times last, children before their folders, so nothing bumps them afterwards.
        let paths = try StoreTestTools.relativePaths(root.path).sorted { $0.count > $1.count }
        for (i, relative) in (paths + [""]).enumerated() {
            let path = relative.isEmpty ? root.path : root.path + "/" + relative
            try StoreTestTools.setTimes(
                path, seconds: 1_600_000_000 + i * 3_601, nanoseconds: 987_654_321 - i * 1_111)
        }
        return root
    }

    @Test func aPackageRoundTripsThroughTheStore() throws {
        let tmp = try TemporaryDirectory()
        let source = try makeSourcePackage(tmp)
        let store = try SQLiteStore(path: tmp.path("Trip.docstore"), options: .create)
        let reported = Mutex<[ProgressReport]>([])
        let info = try store.importItem(at: source) { report in reported.withLock { $0.append(report) } }
        let reports = reported.withLock { $0 }
        #expect(info.name == "Trip.pkg")
        #expect(info.kind == .package)
        #expect(reports.count > 10, "progress is reported chunk by chunk")
        #expect(
            zip(reports, reports.dropFirst()).allSatisfy { $0.completedByteCount <= $1.completedByteCount })
        let last = try #require(reports.last)
        #expect(last.completedByteCount == last.totalByteCount)
        let expectedBytes: Int64 = 3 * 1024 * 1024 + 12_345 + 4096 + 600_000 + 8
        #expect(last.totalByteCount == expectedBytes)
        #expect(last.fileCompletedCount == last.fileTotalCount)
        #expect(try store.checkIntegrity().isClean)

        try tmp.mkdir("Out")
        let exportReports = Mutex(0)
        try store.exportDocument(info.id, to: tmp.url("Out/Trip.pkg")) { _ in
            exportReports.withLock { $0 += 1 }
        }
        #expect(exportReports.withLock { $0 } > 0)
        try StoreTestTools.expectIdentical(source.path, tmp.path("Out/Trip.pkg"))

        // Again over the first export, which it replaces atomically.
        try store.exportDocument(info.id, to: tmp.url("Out/Trip.pkg"))
        try StoreTestTools.expectIdentical(source.path, tmp.path("Out/Trip.pkg"))
        #expect(try tmp.entries("Out") == ["Trip.pkg"], "no scratch folder is left behind")
    }

    @Test func aFlatFileRoundTripsThroughTheStore() throws {
        let tmp = try TemporaryDirectory()
        let file = try tmp.write("Report.pdf", sampleBytes(700_001, seed: 5))
        #expect(chmod(file.path, 0o640) == 0)
        try StoreTestTools.setXattr(file.path, "user.origin", Data("scanner".utf8))
        try StoreTestTools.setTimes(file.path, seconds: 1_234_567_890, nanoseconds: 1)
        let store = try SQLiteStore(path: tmp.path("Flat.docstore"), options: .create)
        let info = try store.importItem(at: file, as: "Scan.pdf")
        #expect(info.kind == .flat)
        #expect(info.name == "Scan.pdf")
        try tmp.mkdir("Out")
        try store.exportDocument(info.id, to: tmp.url("Out/Scan.pdf"))
        try StoreTestTools.expectIdentical(file.path, tmp.path("Out/Scan.pdf"))
    }

    @Test func anOldVersionExports() throws {
        let tmp = try TemporaryDirectory()
        try tmp.write("Doc.pkg/a.txt", "first")
        let store = try SQLiteStore(path: tmp.path("Old.docstore"), options: .create)
        let info = try store.importItem(at: tmp.url("Doc.pkg"))
        let tree = try store.fileWrapper(for: info.id)
        tree.removeFileWrapper(try #require(tree.fileWrappers?["a.txt"]))
        tree.addRegularFile(withContents: Data("second".utf8), preferredFilename: "a.txt")
        try store.save(tree, to: info.id, base: info.currentVersion, origin: "test")
        try tmp.mkdir("Out")
        try store.exportDocument(info.id, at: info.currentVersion, to: tmp.url("Out/Doc.pkg"))
        #expect(try String(contentsOfFile: tmp.path("Out/Doc.pkg/a.txt"), encoding: .utf8) == "first")
        try store.exportDocument(info.id, to: tmp.url("Out/Doc.pkg"))
        #expect(try String(contentsOfFile: tmp.path("Out/Doc.pkg/a.txt"), encoding: .utf8) == "second")
    }

    @Test func namesThatWouldEscapeAreRefused() throws {
        let tmp = try TemporaryDirectory()
        try tmp.write("Doc.pkg/a.txt", "a")
        let store = try SQLiteStore(path: tmp.path("Escape.docstore"), options: .create)
        for bad in ["../Doc.pkg", "a/b", "..", "."] {
            #expect(throws: DocumentStoreError.self, "document name \(bad)") {
                try store.importItem(at: tmp.url("Doc.pkg"), as: bad)
            }
        }
        #expect(try store.documents().isEmpty)
        let info = try store.importItem(at: tmp.url("Doc.pkg"))

        // A destination inside a symbolic link to a folder.
        try tmp.mkdir("Real")
        #expect(symlink(tmp.path("Real"), tmp.path("Linked")) == 0)
        #expect(throws: DocumentStoreError.self) {
            try store.exportDocument(info.id, to: tmp.url("Linked/Doc.pkg"))
        }
        #expect(try tmp.entries("Real").isEmpty)
        #expect(throws: DocumentStoreError.self) {
            try store.exportDocument(info.id, to: tmp.url("Out/.."))
        }

        // A stored name that climbs out (only a damaged or hostile store has one).
        let store2Path = tmp.path("Escape.docstore")
        try StoreTestTools.sqlite(store2Path, "UPDATE nodes SET name = '../evil.txt' WHERE name = 'a.txt';")
        try tmp.mkdir("Out")
        let error = #expect(throws: DocumentStoreError.self) {
            try store.exportDocument(info.id, to: tmp.url("Out/Doc.pkg"))
        }
        #expect(error.map { "\($0)" }?.contains("evil.txt") == true)
        #expect(!FileManager.default.fileExists(atPath: tmp.path("Out/evil.txt")))
        #expect(!FileManager.default.fileExists(atPath: tmp.path("evil.txt")))
        #expect(try tmp.entries("Out").isEmpty)
    }

    /// Fifos, sockets and devices import as metadata-only wrappers and export as themselves;
    /// devices need root to be made again (as root here, EPERM in the export's error otherwise).
    @Test func specialFilesImportAndExport() throws {
        let tmp = try TemporaryDirectory()
        try tmp.write("Doc.pkg/a.txt", "a")
        #expect(mkfifo(tmp.path("Doc.pkg/pipe"), 0o640) == 0)
        #expect(mknod(tmp.path("Doc.pkg/sock"), S_IFSOCK | 0o600, 0) == 0)
        let isRoot = geteuid() == 0
        let device = dev_t(deviceNumber(1, 3))
        if isRoot { #expect(mknod(tmp.path("Doc.pkg/null"), S_IFCHR | 0o644, device) == 0) }
        #expect(mkfifo(tmp.path("Top.fifo"), 0o600) == 0)
        let store = try SQLiteStore(path: tmp.path("Special.docstore"), options: .create)
        let info = try store.importItem(at: tmp.url("Doc.pkg"))
        let records = try store.nodes(of: info.id)
        #expect(records.first { $0.name == "pipe" }?.kind == .fifo)
        #expect(records.first { $0.name == "pipe" }?.permissions == 0o640)
        #expect(records.first { $0.name == "sock" }?.kind == .socket)
        if isRoot {
            #expect(records.first { $0.name == "null" }?.kind == .characterDevice)
            #expect(records.first { $0.name == "null" }?.device == UInt64(device))
        }
        let top = try store.importItem(at: tmp.url("Top.fifo"))
        #expect(top.kind == .flat)
        #expect(try store.node(top.root)?.kind == .fifo)

        try tmp.mkdir("Out")
        try store.exportDocument(info.id, to: tmp.url("Out/Doc.pkg"))
        var st = stat()
        #expect(lstat(tmp.path("Out/Doc.pkg/pipe"), &st) == 0 && st.st_mode & S_IFMT == S_IFIFO)
        #expect(st.st_mode & 0o7777 == 0o640)
        #expect(lstat(tmp.path("Out/Doc.pkg/sock"), &st) == 0 && st.st_mode & S_IFMT == S_IFSOCK)
        if isRoot {
            #expect(lstat(tmp.path("Out/Doc.pkg/null"), &st) == 0 && st.st_mode & S_IFMT == S_IFCHR)
            #expect(st.st_rdev == device)
        }
        try store.exportDocument(top.id, to: tmp.url("Out/Top.fifo"))
        #expect(lstat(tmp.path("Out/Top.fifo"), &st) == 0 && st.st_mode & S_IFMT == S_IFIFO)

        #expect(symlink(tmp.path("Doc.pkg"), tmp.path("Link.pkg")) == 0)
        #expect(throws: DocumentStoreError.self) { try store.importItem(at: tmp.url("Link.pkg")) }
    }

    // MARK: Progress

    @Test func progressIsMeasuredInBytesThenItems() {
        let report = ProgressReport(
            completedByteCount: 4_200_000, totalByteCount: 10_000_000, fileCompletedCount: 3,
            fileTotalCount: 7)
        #expect(report.fractionCompleted == 0.42)
        #expect(ProgressReport(fileCompletedCount: 1, fileTotalCount: 4).fractionCompleted == 0.25)
        #expect(ProgressReport().fractionCompleted == 1)
    }
}
