import Foundation
import StoreTestSupport
import Testing

@testable import DocumentEngine

/// A wrapper tree read from a store keeps that version's records, and a save based on it uses
/// them instead of reading the package again (B6): after every kind of change, the records it
/// keeps for the new version must be exactly what the store reads at that version.
@Suite struct StoredTreeCacheTests {
    func cached(_ wrapper: FileWrapper) -> CachedStoredTree? { wrapper.state.withLock { $0.storedTree } }

    func expectCacheMatchesStore(
        _ wrapper: FileWrapper, _ store: any DocumentStore, _ document: DocumentInfo, _ what: String,
        sourceLocation: SourceLocation = #_sourceLocation
    ) throws {
        let cache = try #require(cached(wrapper), "no cache after \(what)", sourceLocation: sourceLocation)
        let current = try store.document(document.id)
        #expect(cache.version == current.currentVersion, "\(what)", sourceLocation: sourceLocation)
        let fresh = try StoredTree(
            records: store.nodes(of: document.id, at: cache.version), root: document.root,
            location: store.location)
        for id in Set(cache.tree.records.keys).union(fresh.records.keys)
        where cache.tree.records[id] != fresh.records[id] {
            Issue.record(
                "after \(what), \(id) is kept as \(String(describing: cache.tree.records[id])) but stored as \(String(describing: fresh.records[id]))",
                sourceLocation: sourceLocation)
        }
        #expect(cache.tree.children == fresh.children, "names after \(what)", sourceLocation: sourceLocation)
    }

    @Test(
        "the records kept after a save are the store's, after every kind of change",
        arguments: StoreKind.everyBackend)
    func cacheMatchesStore(_ kind: StoreKind) throws {
        let fixture = try StoreFixture(kind)
        let store = fixture.store
        let document = try store.createDocument(
            named: "P.pkg", kind: .package, type: nil, permissions: nil, origin: "t")
        let first = FileWrapper(directoryWithFileWrappers: [
            "a.txt": FileWrapper(regularFileWithContents: Data("a".utf8)),
            "sub": FileWrapper(directoryWithFileWrappers: [
                "b.txt": FileWrapper(regularFileWithContents: Data("b".utf8))
            ]),
        ])
        try store.save(first, to: document.id, base: document.currentVersion, origin: "t")
        let wrapper = try store.fileWrapper(for: document.id)
        try expectCacheMatchesStore(wrapper, store, document, "the read")

        func save(_ what: String, _ change: (FileWrapper) throws -> Void) throws {
            try change(wrapper)
            // Without records kept (after a rebase), the base is the store's current version.
            let base = try cached(wrapper)?.version ?? store.document(document.id).currentVersion
            let result = try store.save(wrapper, to: document.id, base: base, origin: "t")
            #expect(!result.isConflict)
            try expectCacheMatchesStore(wrapper, store, document, what)
        }
        try save("new contents") { root in
            let children = try root.children()
            root.removeFileWrapper(children["a.txt"]!)
            _ = root.addRegularFile(withContents: Data("changed".utf8), preferredFilename: "a.txt")
        }
        try save("a new file and folder") { root in
            _ = root.addRegularFile(withContents: Data("c".utf8), preferredFilename: "c.txt")
            let folder = FileWrapper(directoryWithFileWrappers: [
                "d.txt": FileWrapper(regularFileWithContents: Data("d".utf8))
            ])
            folder.preferredFilename = "new folder"
            _ = root.addFileWrapper(folder)
        }
        try save("a move between folders") { root in
            let children = try root.children()
            let sub = children["sub"]!
            let c = children["c.txt"]!
            root.removeFileWrapper(c)
            _ = sub.addFileWrapper(c)
        }
        try save("a removal") { root in
            let sub = try root.children()["sub"]!
            sub.removeFileWrapper(try sub.children()["b.txt"]!)
        }
        try save("new permissions and a renamed file") { root in
            let children = try root.children()
            let a = children["a.txt"]!
            a.fileAttributes[.posixPermissions] = 0o600
            root.removeFileWrapper(a)
            a.preferredFilename = "renamed.txt"
            _ = root.addFileWrapper(a)
        }
        try save("nothing") { _ in }
        // Another process saves meanwhile: the next save is applied on top of it (rebased), and
        // the records kept are dropped rather than trusted.
        let other = try store.fileWrapper(for: document.id)
        let otherSub = try other.children()["sub"]!
        otherSub.removeFileWrapper(try otherSub.children()["c.txt"]!)
        _ = otherSub.addRegularFile(withContents: Data("other".utf8), preferredFilename: "c.txt")
        try store.save(other, to: document.id, base: try #require(cached(other)).version, origin: "other")
        let mine = try wrapper.children()["renamed.txt"]!
        wrapper.removeFileWrapper(mine)
        _ = wrapper.addRegularFile(withContents: Data("mine".utf8), preferredFilename: "renamed.txt")
        let base = try #require(cached(wrapper)).version
        let rebased = try store.save(
            wrapper, to: document.id, base: base, origin: "t", conflictPolicy: .rebaseIfDisjoint)
        #expect(!rebased.isConflict && rebased.rebasedOnto != nil && rebased.rebasedOnto != base)
        #expect(cached(wrapper) == nil, "records kept across another process's save")
        // A wrapper the other process changed still reads what this tree had (it was read as 1
        // byte, and must not become the first byte of the other's 5).
        let mineC = try #require(try wrapper.children()["sub"]?.children()["c.txt"])
        #expect(mineC.regularFileContents == Data("c".utf8))
        let c = try #require(try store.nodes(of: document.id).first { $0.name == "c.txt" })
        #expect(try store.readContents(of: c.id, at: nil, offset: 0, count: 5) == Data("other".utf8))
        // The next save reads the store again, and keeps its records once more.
        try save("a save after the rebase") { root in
            _ = root.addRegularFile(withContents: Data("e".utf8), preferredFilename: "e.txt")
        }
    }
}
