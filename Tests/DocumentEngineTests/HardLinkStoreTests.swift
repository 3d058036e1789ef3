import Foundation
import StoreTestSupport
import Testing

@testable import DocumentEngine

#if canImport(Glibc)
    import Glibc
#endif

/// Hard links in the store: import and export keep them, the store reads a
/// link as its file, and the file-wrapper bridge keeps or breaks them as a wrapper tree allows.
@Suite struct HardLinkStoreTests {
    /// A folder `Doc` with `a` and `d/b` one file, and `c` a file of its own.
    func makeFolder(_ tmp: TemporaryDirectory, _ name: String = "Doc") throws -> URL {
        let folder = tmp.url(name)
        try FileManager.default.createDirectory(
            at: folder.appendingPathComponent("d"), withIntermediateDirectories: true)
        try Data("shared\n".utf8).write(to: folder.appendingPathComponent("a"))
        #expect(link(folder.path + "/a", folder.path + "/d/b") == 0)
        try Data("solo\n".utf8).write(to: folder.appendingPathComponent("c"))
        return folder
    }

    func paths(_ store: any DocumentStore, _ document: DocumentID) throws -> [String: NodeRecord] {
        let records = try store.nodes(of: document)
        let byID = Dictionary(uniqueKeysWithValues: records.map { ($0.id, $0) })
        var result: [String: NodeRecord] = [:]
        for record in records {
            var names: [String] = []
            var current: NodeRecord? = record
            while let node = current, node.parent != nil {
                names.append(node.name)
                current = node.parent.flatMap { byID[$0] }
            }
            result[names.reversed().joined(separator: "/")] = record
        }
        return result
    }

    @Test("import and export keep hard links; a link reads as its file", arguments: StoreKind.everyBackend)
    func importExport(_ kind: StoreKind) throws {
        let tmp = try TemporaryDirectory()
        let fixture = try StoreFixture(kind)
        let store = fixture.store
        let info = try store.importItem(at: try makeFolder(tmp))
        let tree = try paths(store, info.id)
        let (a, b) = (try #require(tree["a"]), try #require(tree["d/b"]))
        #expect(a.linkOf == b.id || b.linkOf == a.id)
        #expect(tree["c"]?.linkOf == nil)
        // Both names read as the file: kind, size, attributes and bytes.
        #expect(a.size == 7 && b.size == 7 && a.permissions == b.permissions && a.modified == b.modified)
        #expect(try store.readContents(of: b.id, at: nil, offset: 0, count: 100) == Data("shared\n".utf8))
        #expect(try store.readContents(of: a.id, at: nil, offset: 0, count: 100) == Data("shared\n".utf8))
        #expect(try store.checkIntegrity().isClean)

        try FileManager.default.createDirectory(at: tmp.url("out"), withIntermediateDirectories: true)
        try store.exportDocument(info.id, to: tmp.url("out/Doc"))
        var sa = stat()
        var sb = stat()
        var sc = stat()
        #expect(lstat(tmp.path("out/Doc/a"), &sa) == 0 && lstat(tmp.path("out/Doc/d/b"), &sb) == 0)
        #expect(lstat(tmp.path("out/Doc/c"), &sc) == 0)
        #expect(sa.st_ino == sb.st_ino && sa.st_nlink == 2 && sc.st_nlink == 1)
        #expect(try Data(contentsOf: tmp.url("out/Doc/d/b")) == Data("shared\n".utf8))
    }

    @Test(
        "the file-wrapper bridge keeps an unchanged link, and makes a changed one, or one whose file is gone, a file of its own",
        arguments: StoreKind.everyBackend)
    func wrappers(_ kind: StoreKind) throws {
        let tmp = try TemporaryDirectory()
        let fixture = try StoreFixture(kind)
        let store = fixture.store
        var info = try store.importItem(at: try makeFolder(tmp))
        let before = try paths(store, info.id)
        // Which of the two is the file depends on the order the folder was read in.
        let (fileName, linkName) = before["a"]?.linkOf == nil ? ("a", "d/b") : ("d/b", "a")

        // Saved unchanged: nothing is written, the link stays.
        var wrapper = try store.fileWrapper(for: info.id)
        var result = try store.save(wrapper, to: info.id, base: info.currentVersion, origin: "test")
        #expect(result.nodesWritten == 0)
        #expect(try paths(store, info.id)[linkName]?.linkOf == before[fileName]?.id)

        // The file's name removed from the tree: the link keeps the bytes as a file of its own.
        info = try store.document(info.id)
        wrapper = try store.fileWrapper(for: info.id)
        func child(_ path: String) throws -> (parent: FileWrapper, child: FileWrapper) {
            var parent = wrapper
            let parts = path.split(separator: "/").map(String.init)
            for part in parts.dropLast() { parent = try #require(try parent.children()[part]) }
            return (parent, try #require(try parent.children()[parts[parts.count - 1]]))
        }
        let file = try child(fileName)
        file.parent.removeFileWrapper(file.child)
        result = try store.save(wrapper, to: info.id, base: info.currentVersion, origin: "test")
        #expect(!result.isConflict)
        var after = try paths(store, info.id)
        #expect(after[fileName] == nil)
        let kept = try #require(after[linkName])
        #expect(kept.linkOf == nil)
        #expect(try store.readContents(of: kept.id, at: nil, offset: 0, count: 100) == Data("shared\n".utf8))
        #expect(result.bytesWritten == 0)  // the bytes are shared, not written again
        #expect(try store.checkIntegrity().isClean)

        // A link whose wrapper's contents change becomes a file of its own; its file keeps its bytes.
        let second = try store.importItem(at: try makeFolder(tmp, "Doc2"))
        let tree = try paths(store, second.id)
        let (file2, link2) = tree["a"]?.linkOf == nil ? ("a", "d/b") : ("d/b", "a")
        wrapper = try store.fileWrapper(for: second.id)
        let changed = try child(link2)
        changed.parent.removeFileWrapper(changed.child)
        _ = changed.parent.addRegularFile(
            withContents: Data("changed\n".utf8), preferredFilename: changed.child.preferredFilename ?? "")
        result = try store.save(wrapper, to: second.id, base: second.currentVersion, origin: "test")
        after = try paths(store, second.id)
        #expect(after[link2]?.linkOf == nil)
        #expect(after[file2]?.linkOf == nil)
        #expect(
            try store.readContents(of: try #require(after[link2]).id, at: nil, offset: 0, count: 100)
                == Data("changed\n".utf8))
        #expect(
            try store.readContents(of: try #require(after[file2]).id, at: nil, offset: 0, count: 100)
                == Data("shared\n".utf8))
        #expect(try store.checkIntegrity().isClean)
    }
}
