import Foundation
import StoreTestSupport
import TestSupport
import Testing

@testable import DocumentEngine

/// Reads as of any version stay right while a file's history grows, is thinned, restored and
/// branched. The SQL backends answer reads at the current version from a copy of each file's
/// current extents (`extents_live`), so a save's cost follows the file, not its history; the
/// integrity check compares that copy with the history, so every check here also proves the
/// copy was kept in step.
@Suite struct StoreHistoryReadTests {
    let fixture: StoreFixture
    var store: any DocumentStore { fixture.store }
    /// Every saved main-line version and the bytes the file held then.
    var expected: [(version: VersionID, bytes: Data)] = []

    init(_ kind: StoreKind) throws { fixture = try StoreFixture(kind, chunkSize: 64 * 1024) }

    func read(_ node: StoreNodeID, at version: VersionID?) throws -> Data {
        let size = try #require(try store.node(node, at: version)).size
        return try store.readContents(of: node, at: version, offset: 0, count: Int(size))
    }

    mutating func save(_ document: DocumentInfo, _ node: StoreNodeID, _ update: ContentUpdate, bytes: Data)
        throws
    {
        var changes = DocumentChanges(
            document: document.id, base: try store.document(document.id).currentVersion)
        var record = try #require(try store.node(node))
        record.size = Int64(bytes.count)
        changes.nodes = [record]
        changes.contents[node] = update
        let saved = try store.save(changes)
        #expect(!saved.isConflict)
        expected.append((saved.version.id, bytes))
        try expectEveryVersionReads(node)
    }

    func expectEveryVersionReads(_ node: StoreNodeID) throws {
        #expect(try read(node, at: nil) == expected.last?.bytes)
        let kept = Set(try store.versions(of: try #require(try store.node(node)).document).map(\.id))
        for (version, bytes) in expected where kept.contains(version) {
            #expect(try read(node, at: version) == bytes, "as of version \(version.rawValue)")
        }
        let report = try store.checkIntegrity()
        #expect(report.isClean, "\(report.problems)")
    }

    @Test(
        "A file replaced, edited, cut, grown, emptied and restored reads right as of every version, before and after thinning",
        arguments: StoreKind.everyBackend)
    static func history(_ kind: StoreKind) throws {
        var test = try Self(kind)
        try test.history()
    }

    mutating func history() throws {
        let document = try store.createDocument(
            named: "h.bin", kind: .flat, type: nil, permissions: nil, origin: "")
        let node = document.root
        let first = sampleBytes(400_000, seed: 1)
        try save(document, node, .replace(DataContentsSource(first)), bytes: first)
        // Whole new contents: every start moves, the old ones are removed.
        let second = sampleBytes(300_000, seed: 2)
        try save(document, node, .replace(DataContentsSource(second)), bytes: second)
        // One page rewritten in place.
        var edited = second
        edited.replaceSubrange(70_000..<70_100, with: Data(repeating: 7, count: 100))
        try save(
            document, node, .sparse(size: 300_000, chunks: [1], source: DataContentsSource(edited)),
            bytes: edited)
        // Cut, then grown with zeros.
        try save(document, node, .chunks(size: 100_000, [:]), bytes: edited.prefix(100_000))
        try save(
            document, node, .chunks(size: 250_000, [:]), bytes: edited.prefix(100_000) + Data(count: 150_000))
        // The first contents again: their starts come back.
        try save(document, node, .replace(DataContentsSource(first)), bytes: first)
        // Emptied, then filled.
        try save(document, node, .replace(DataContentsSource(Data())), bytes: Data())
        let third = sampleBytes(200_000, seed: 3)
        try save(document, node, .replace(DataContentsSource(third)), bytes: third)

        // A conflict branch reads on top of the main line as of its base.
        var theirs = DocumentChanges(document: document.id, base: expected[1].version)
        let branch = sampleBytes(150_000, seed: 4)
        var record = try #require(try store.node(node))
        record.size = Int64(branch.count)
        theirs.nodes = [record]
        theirs.contents[node] = .replace(DataContentsSource(branch))
        let conflict = try store.save(theirs)
        #expect(conflict.isConflict)
        #expect(try read(node, at: conflict.version.id) == branch)
        try expectEveryVersionReads(node)

        // Restoring an old version is a new save of its bytes.
        let restored = try store.restore(expected[2].version, of: document.id, origin: "test")
        expected.append((restored.version.id, expected[2].bytes))
        try expectEveryVersionReads(node)

        // Thinning removes rows of the history; what is kept still reads right.
        try store.setRetentionPolicy(
            .init(keepLast: 3, keepAll: .zero, tiers: [], deletedDocumentsExpireAfter: .seconds(3600)))
        let report = try store.collectGarbage()
        #expect(report.versionsRemoved >= 5)
        try expectEveryVersionReads(node)
        #expect(try read(node, at: conflict.version.id) == branch)

        // And saves after the thinning start from the right contents.
        var later = try #require(expected.last).bytes
        later.replaceSubrange(10..<20, with: Data(repeating: 1, count: 10))
        try save(
            document, node, .sparse(size: Int64(later.count), chunks: [0], source: DataContentsSource(later)),
            bytes: later)
        try save(document, node, .replace(DataContentsSource(second)), bytes: second)
    }

    @Test(
        "A file removed from a package, once thinned away, leaves no current extents behind",
        arguments: StoreKind.everyBackend)
    static func removedFile(_ kind: StoreKind) throws {
        let test = try Self(kind)
        let store = test.store
        let document = try store.createDocument(
            named: "p.pkg", kind: .package, type: nil, permissions: nil, origin: "")
        let id = try store.makeNodeIDs(count: 1)[0]
        var add = DocumentChanges(document: document.id, base: document.currentVersion)
        add.nodes = [
            NodeRecord(
                id: id, document: document.id, parent: document.root, name: "f.bin", kind: .regularFile,
                permissions: 0o644)
        ]
        add.contents[id] = .replace(DataContentsSource(sampleBytes(300_000, seed: 6)))
        let added = try store.save(add)
        var edit = DocumentChanges(document: document.id, base: added.version.id)
        edit.contents[id] = .replace(DataContentsSource(sampleBytes(300_000, seed: 7)))
        let edited = try store.save(edit)
        var remove = DocumentChanges(document: document.id, base: edited.version.id)
        remove.removedNodes = [id]
        try store.save(remove)
        try store.setRetentionPolicy(
            .init(keepLast: 1, keepAll: .zero, tiers: [], deletedDocumentsExpireAfter: .seconds(3600)))
        let collected = try store.collectGarbage()
        #expect(collected.versionsRemoved >= 2)
        let report = try store.checkIntegrity()
        #expect(report.isClean, "\(report.problems)")
    }

    @Test("A deleted document's files leave no current extents behind", arguments: StoreKind.everyBackend)
    static func deletedDocument(_ kind: StoreKind) throws {
        var test = try Self(kind)
        let document = try test.store.createDocument(
            named: "gone.bin", kind: .flat, type: nil, permissions: nil, origin: "")
        let bytes = sampleBytes(200_000, seed: 5)
        try test.save(document, document.root, .replace(DataContentsSource(bytes)), bytes: bytes)
        try test.store.deleteDocument(document.id, origin: "test")
        try test.store.setRetentionPolicy(
            .init(keepLast: 1, keepAll: .zero, tiers: [], deletedDocumentsExpireAfter: .zero))
        _ = try test.store.collectGarbage()
        #expect(try test.store.deletedDocuments().isEmpty)
        let report = try test.store.checkIntegrity()
        #expect(report.isClean, "\(report.problems)")
    }
}
