import DocumentEngine
import Foundation
import StoreSQL
import StoreTestSupport
import TestSupport
import Testing

@testable import VersionedStore

/// A folder never holds two wrappers of one name, whatever the history of the name.
@Suite("Store: names in a folder")
struct StoreNameTests {
    let fixture: StoreFixture
    var store: any DocumentStore { fixture.store }
    let document: DocumentInfo

    init(_ kind: StoreKind) throws {
        fixture = try StoreFixture(kind)
        document = try fixture.store.createDocument(
            named: "Notes.pkg", kind: .package, type: nil, permissions: nil, origin: "")
    }

    @discardableResult
    func save(nodes: [NodeRecord] = [], removing: [StoreNodeID] = [], base: VersionID? = nil) throws
        -> SaveResult
    {
        var changes = DocumentChanges(
            document: document.id, base: try base ?? store.document(document.id).currentVersion)
        changes.nodes = nodes
        changes.removedNodes = removing
        return try store.save(changes)
    }

    func file(_ name: String) throws -> NodeRecord {
        let id = try #require(try store.makeNodeIDs(count: 1).first)
        return NodeRecord(
            id: id, document: document.id, parent: document.root, name: name, kind: .regularFile,
            permissions: 0o644)
    }

    func expectTaken(_ name: String, sourceLocation: SourceLocation = #_sourceLocation) throws {
        let error = #expect(throws: DocumentStoreError.self, sourceLocation: sourceLocation) {
            try save(nodes: [try file(name)])
        }
        #expect("\(error.map { "\($0)" } ?? "")".contains("already exists"), sourceLocation: sourceLocation)
    }

    @Test(
        "Safe-saves leave a removed wrapper per save; the name stays taken by the live one and only by it",
        arguments: StoreKind.everyBackend)
    static func safeSaves(_ kind: StoreKind) throws { try Self(kind).safeSaves() }
    func safeSaves() throws {
        var current = try file("notes.txt")
        let first = try save(nodes: [current]).version.id
        let original = current
        for _ in 0..<25 {
            var temporary = try file("notes.txt.new")
            try save(nodes: [temporary])
            temporary.name = "notes.txt"
            try save(nodes: [temporary], removing: [current.id])
            current = temporary
        }
        try expectTaken("notes.txt")
        // Every temporary name was renamed away, so it is free.
        try save(nodes: [try file("notes.txt.new")])
        // Renamed away and the name given to another in one save.
        var renamed = current
        renamed.name = "old.txt"
        let newcomer = try file("notes.txt")
        try save(nodes: [renamed, newcomer])
        try expectTaken("notes.txt")
        try expectTaken("old.txt")
        // The newest rows of the name are removals only: free.
        try save(removing: [newcomer.id])
        try save(nodes: [try file("notes.txt")])
        // As of the first version only the original had it: a save based there (a conflict
        // branch) may not give it to another, and may rename the original.
        let conflicting = try file("notes.txt")
        #expect(throws: DocumentStoreError.self) { try save(nodes: [conflicting], base: first) }
        var moved = original
        moved.name = "first.txt"
        let branched = try save(nodes: [moved, conflicting], base: first)
        #expect(
            try store.versions(of: document.id).contains { $0.id == branched.version.id && $0.isConflict })
        #expect(try store.checkIntegrity().isClean)
    }

    @Test("The check that a name is free reads the names index, not every wrapper that had the name")
    static func theCheckUsesTheIndex() throws {
        let fixture = try StoreFixture(.sqlite)
        let plan = try fixture.sql(
            "EXPLAIN QUERY PLAN "
                + PortableSQL.nodesNamed(parent: "1", name: "'n'", except: "2", branch: "0", limit: "9"))
        #expect(
            plan.contains("nodes_by_name (parent=? AND name=? AND branch=? AND removed=? AND version<?)"),
            "\(plan)")
        #expect(!plan.contains("SCAN nodes"), "\(plan)")
    }
}
