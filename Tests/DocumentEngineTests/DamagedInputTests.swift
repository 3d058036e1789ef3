import Foundation
import GRDB
import Testing

@testable import DocumentEngine
@testable import SQLiteStore

/// Regression tests for what the fuzzers (Fuzz/, scripts/fuzz.sh) found.
@Suite struct DamagedInputTests {
    /// fuzz-store: a stored value of the wrong type (text where an integer belongs, NULL) stopped
    /// the process in GRDB's row subscript; now every row decoder throws `corrupt`.
    @Test func aValueOfTheWrongTypeInAStoredRowThrows() throws {
        for (columns, values) in [
            (
                ["id", "document", "base", "created", "origin", "branch", "resolved", "bytes_written"],
                [1, 1, nil, 0, 0, 0, 0, 0] as [Int?]
            )
        ] {
            let row = Row(
                Dictionary(
                    uniqueKeysWithValues: zip(columns, values.map { $0 as (any DatabaseValueConvertible)? })))
            #expect(throws: DocumentStoreError.self) { try SQLiteStore.version(row) }
        }
        let nodeRow = Row([
            "node": 1, "document": 1, "parent": nil, "name": "n", "preferred_name": nil, "kind": 0,
            "permissions": 420,
            "uid": "garbage", "gid": 0, "mtime": 0, "ctime": 0, "atime": 0, "btime": 0, "size": 0,
            "link_target": nil,
            "xattrs": nil, "version": 1,
        ])
        #expect(throws: DocumentStoreError.self) { try SQLiteStore.record(nodeRow) }
        let documentRow = Row([
            "id": 1, "name": nil, "type": "t", "kind": 0, "root": 1, "current_version": 1, "created": 0,
            "modified": 0,
        ])
        #expect(throws: DocumentStoreError.self) { try SQLiteStore.document(documentRow) }
    }

    @Test func aDamagedRowInAStoreFileIsAnErrorOfThatDocumentOnly() throws {
        let tmp = try TemporaryDirectory()
        let path = tmp.path("Damaged.docstore")
        let store = try SQLiteStore(path: path, options: .create)
        for name in ["a.txt", "b.txt"] {
            let info = try store.createDocument(
                named: name, kind: .flat, type: nil, permissions: nil, origin: "test")
            try store.save(
                FileWrapper(regularFileWithContents: Data(name.utf8)), to: info.id, base: info.currentVersion,
                origin: "test")
        }
        let a = try #require(try store.document(named: "a.txt"))
        let b = try #require(try store.document(named: "b.txt"))
        try StoreTestTools.sqlite(path, "UPDATE nodes SET uid = 'garbage' WHERE node = \(a.root.rawValue);")
        try StoreTestTools.sqlite(
            path, "UPDATE versions SET resolved = 'garbage' WHERE document = \(b.id.rawValue);")
        let other = try SQLiteStore(path: path)
        let error = #expect(throws: DocumentStoreError.self) { try other.nodes(of: a.id) }
        #expect(error.map { "\($0)" }?.contains("uid") == true, "\(String(describing: error))")
        #expect(throws: DocumentStoreError.self) { try other.versions(of: b.id) }
        // The rest of the store reads on.
        #expect(try other.nodes(of: b.id).count == 1)
        #expect(try other.documents().count == 2)
    }

    /// The integrity check, garbage collection, the event feed and chunk reads read rows too:
    /// a value of the wrong type is a problem in the report or a `corrupt` error, never a crash.
    @Test func damagedChunkEventAndVersionRowsAreReportedNotFatal() throws {
        let tmp = try TemporaryDirectory()
        let path = tmp.path("Damaged.docstore")
        let store = try SQLiteStore(path: path, options: .create)
        let info = try store.createDocument(
            named: "a.txt", kind: .flat, type: nil, permissions: nil, origin: "test")
        try store.save(
            FileWrapper(regularFileWithContents: Data("a".utf8)), to: info.id, base: info.currentVersion,
            origin: "test")
        try StoreTestTools.sqlite(path, "UPDATE chunks SET size = 'garbage';")
        try StoreTestTools.sqlite(path, "UPDATE events SET document = 'garbage';")
        try StoreTestTools.sqlite(path, "UPDATE versions SET created = 'garbage';")
        let other = try SQLiteStore(path: path)
        let report = try other.checkIntegrity()
        #expect(report.problems.contains { $0.contains("size") }, "\(report.problems)")
        #expect(throws: DocumentStoreError.self) { try other.events(after: 0) }
        #expect(throws: DocumentStoreError.self) { try other.collectGarbage(.currentOnly) }
        try StoreTestTools.sqlite(path, "UPDATE versions SET branch = 'garbage';")
        let current = try #require(try other.document(named: "a.txt")).currentVersion
        #expect(throws: DocumentStoreError.self) { try other.nodes(of: info.id, at: current) }
    }

    /// fuzz-archive: a binary property list holding a set of containers made corelibs Foundation's
    /// parser dereference a null pointer (SIGSEGV) inside `KeyedArchive.validate`.
    @Test func aBinaryPropertyListWithASetIsRefused() throws {
        let crash = try Data(
            contentsOf: FuzzCorpusTests.corpus.appendingPathComponent(
                "archive/crash-bplist-set-of-containers"))
        #expect(throws: ArchiveError.self) { try KeyedArchive.validate(crash, allowedClassNames: []) }
        #expect(throws: ArchiveError.self) {
            try KeyedArchive.unarchivedObject(ofClasses: [NSArray.self], from: crash)
        }
        // Real archives, sets included (NSKeyedArchiver writes them as arrays), still decode.
        let set = try KeyedArchive.archivedData(
            withRootObject: NSSet(array: [1, "x"]), requiringSecureCoding: true)
        #expect(!ArchiveValidator.binaryPropertyListHasSet(set))
        #expect(try KeyedArchive.unarchivedObject(ofClasses: [NSSet.self], from: set) is NSSet)
    }
}
