import CLinuxSupport
import DocumentEngine
import Foundation
import Testing
import TestSupport

#if canImport(Glibc)
    import Glibc
#endif

/// Reading package folders and flat files (R-1..R-9, FW-1, FW-7, FW-9, FW-10;
/// docs/library/apple-behaviours.md).
@Suite struct FileWrapperReadingTests {
    @Test("R-2: lazy read takes names and attributes at init, the child list on first access")
    func lazyDirectory() throws {
        let tmp = try TemporaryDirectory()
        try tmp.write("pkg/a.txt", "a")
        let w = try FileWrapper(url: tmp.url("pkg"))
        #expect(w.isDirectory)
        #expect(w.filename == "pkg" && w.preferredFilename == "pkg")  // FW-9, FW-10
        try tmp.write("pkg/b.txt", "b")  // appears before the first access, so it is listed
        #expect(Set(try w.children().keys) == ["a.txt", "b.txt"])
        let child = try #require(w.fileWrappers?["a.txt"])
        #expect(child.filename == "a.txt" && child.preferredFilename == "a.txt")
    }

    @Test("R-1: .immediate reads the whole tree and its bytes at init")
    func immediate() throws {
        let tmp = try TemporaryDirectory()
        try tmp.write("pkg/a.txt", "old")
        try tmp.write("pkg/sub/c.txt", "c")
        let w = try FileWrapper(url: tmp.url("pkg"), options: .immediate)
        try tmp.write("pkg/a.txt", "replaced")  // after init: must not be seen
        try tmp.write("pkg/b.txt", "b")
        #expect(Set(try w.children().keys) == ["a.txt", "sub"])
        #expect(try w.children()["a.txt"]?.contents() == Data("old".utf8))
        #expect(try w.children()["sub"]?.children()["c.txt"]?.contents() == Data("c".utf8))
    }

    @Test("R-2/R-3: lazy contents are read on first access and never from another version")
    func lazyContents() throws {
        let tmp = try TemporaryDirectory()
        try tmp.write("pkg/a.txt", "first")
        let w = try FileWrapper(url: tmp.url("pkg"))
        let a = try #require(w.fileWrappers?["a.txt"])
        #expect(a.contentsLength == 5)
        // Replacing the file before the first access: the wrapper refuses the new bytes.
        try tmp.write("pkg/a.txt", "second version")
        #expect(throws: FileWrapperError.contentsChangedOnDisk(path: tmp.path("pkg/a.txt"))) {
            try a.contents()
        }
        #expect(a.regularFileContents == nil)  // the accessor returns nil
        // read(from:) refreshes it.
        try a.read(from: tmp.url("pkg/a.txt"))
        #expect(a.regularFileContents == Data("second version".utf8))
    }

    @Test("Item 5: ranged reads of a large file do not load it")
    func rangedRead() throws {
        let tmp = try TemporaryDirectory()
        let path = tmp.path("big.bin")
        let fd = open(path, O_CREAT | O_WRONLY, 0o644)
        #expect(fd >= 0)
        let size: Int64 = 8 << 30  // 8 GiB, sparse
        #expect(ftruncate(fd, off_t(size)) == 0)
        let marker = Data("MARK".utf8)
        _ = marker.withUnsafeBytes { pwrite(fd, $0.baseAddress, 4, off_t(size - 4)) }
        close(fd)
        let w = try FileWrapper(url: URL(fileURLWithPath: path))
        #expect(w.contentsLength == size)
        #expect(try w.readContents(offset: size - 4, count: 100) == marker)
        #expect(try w.readContents(offset: size, count: 1).isEmpty)
        #expect(try w.readContents(offset: 1 << 30, count: 3) == Data([0, 0, 0]))
        #expect(throws: FileWrapperError.self) { try w.readContents(offset: -1, count: 1) }
        let source = try #require(w.contentsSource)
        #expect(source.count == size)
        #expect(try source.read(offset: size - 2, count: 2) == Data("RK".utf8))
    }

    @Test("R-4: contents may be mapped by default, never with .withoutMapping")
    func mapping() throws {
        let tmp = try TemporaryDirectory()
        try tmp.write("f.bin", sampleBytes(100_000, seed: 1))
        let mapped = try FileWrapper(url: tmp.url("f.bin"))
        let unmapped = try FileWrapper(url: tmp.url("f.bin"), options: .withoutMapping)
        #expect((mapped.contentsSource as? DiskContentsSource)?.mayMap == true)
        #expect((unmapped.contentsSource as? DiskContentsSource)?.mayMap == false)
        #expect(try mapped.contents() == sampleBytes(100_000, seed: 1))
        #expect(try unmapped.contents() == sampleBytes(100_000, seed: 1))
    }

    @Test("FW-7: links are read as links, never followed")
    func links() throws {
        let tmp = try TemporaryDirectory()
        try tmp.mkdir("pkg")
        try tmp.write("outside.txt", "secret")
        #expect(symlink("../outside.txt", tmp.path("pkg/rel")) == 0)
        #expect(symlink("/etc/hostname", tmp.path("pkg/abs")) == 0)
        let w = try FileWrapper(url: tmp.url("pkg"), options: .immediate)
        let rel = try #require(w.fileWrappers?["rel"])
        #expect(rel.isSymbolicLink)
        #expect(try rel.symbolicLinkDestination() == "../outside.txt")
        #expect(rel.symbolicLinkDestinationURL?.relativePath == "../outside.txt")
        #expect(try w.fileWrappers?["abs"]?.symbolicLinkDestination() == "/etc/hostname")
        #expect(rel.regularFileContents == nil)
    }

    @Test("R-7: matchesContents compares kind and mtime within 1 s, never bytes")
    func matching() throws {
        let tmp = try TemporaryDirectory()
        try tmp.write("pkg/a.txt", "a")
        let w = try FileWrapper(url: tmp.url("pkg"), options: .immediate)
        #expect(w.matchesContents(of: tmp.url("pkg")))
        #expect(!w.needsToBeUpdated(fromPath: tmp.path("pkg")))
        let a = try #require(w.fileWrappers?["a.txt"])
        let mtime = try #require(a.modificationDate)
        try setModificationDate(tmp.path("pkg/a.txt"), mtime.addingTimeInterval(0.5))
        #expect(w.matchesContents(of: tmp.url("pkg")))
        try setModificationDate(tmp.path("pkg/a.txt"), mtime.addingTimeInterval(5))
        #expect(!w.matchesContents(of: tmp.url("pkg")))  // found through the loaded child
        #expect(w.needsToBeUpdated(fromPath: tmp.path("pkg")))
        #expect(!a.matchesContents(of: tmp.url("pkg")))  // kind differs
        #expect(!w.matchesContents(of: tmp.url("missing")))
    }

    @Test("R-5: read(from:) keeps matching children in place, removes and adds the rest")
    func rereadInPlace() throws {
        let tmp = try TemporaryDirectory()
        try tmp.write("pkg/keep.txt", "keep")
        try tmp.write("pkg/gone.txt", "gone")
        try tmp.write("pkg/changed.txt", "v1")
        let w = try FileWrapper(url: tmp.url("pkg"), options: .immediate)
        let keep = try #require(w.fileWrappers?["keep.txt"])
        let changed = try #require(w.fileWrappers?["changed.txt"])
        try FileManager.default.removeItem(atPath: tmp.path("pkg/gone.txt"))
        try tmp.write("pkg/new.txt", "new")
        try tmp.write("pkg/changed.txt", "v2")
        try setModificationDate(tmp.path("pkg/changed.txt"), Date().addingTimeInterval(10))
        try w.read(from: tmp.url("pkg"))
        let children = try w.children()
        #expect(Set(children.keys) == ["keep.txt", "new.txt", "changed.txt"])
        #expect(children["keep.txt"] === keep)
        #expect(children["changed.txt"] === changed)
        #expect(try changed.contents() == Data("v2".utf8))
        #expect(try keep.contents() == Data("keep".utf8))
    }

    @Test("R-5: a loaded file whose mtime matches is not re-read, only its attributes")
    func rereadSkipsUnchanged() throws {
        let tmp = try TemporaryDirectory()
        let url = try tmp.write("f.txt", "one")
        let w = try FileWrapper(url: url, options: .immediate)
        let mtime = try #require(w.modificationDate)
        try tmp.write("f.txt", "two")  // new bytes, same mtime: Apple keeps the loaded contents
        try setModificationDate(url.path, mtime)
        chmod(url.path, 0o600)
        try w.read(from: url)
        #expect(try w.contents() == Data("one".utf8))
        #expect(w.posixPermissions == 0o600)
    }

    @Test("FW-1: reading may change the kind")
    func kindChange() throws {
        let tmp = try TemporaryDirectory()
        let url = try tmp.write("item", "file")
        let w = try FileWrapper(url: url)
        #expect(w.isRegularFile)
        try FileManager.default.removeItem(at: url)
        try tmp.write("item/inner.txt", "x")
        try w.read(from: url)
        #expect(w.isDirectory)
        #expect(Set(try w.children().keys) == ["inner.txt"])
    }

    @Test("R-9: a directory read keeps exact on-disk names as keys; equivalent names are uniqued")
    func keysFromDisk() throws {
        let tmp = try TemporaryDirectory()
        try tmp.write("pkg/Readme", "1")
        try tmp.write("pkg/README", "2")
        try tmp.write("pkg/caf\u{E9}", "nfc")
        try tmp.write("pkg/cafe\u{301}", "nfd")
        let w = try FileWrapper(url: tmp.url("pkg"))
        let keys = Set(try w.children().keys)
        #expect(keys.contains("Readme") && keys.contains("README"))
        #expect(keys.count == 4)
        #expect(keys.contains { $0.hasPrefix("1__#$!@%!#__") })
        // The uniqued one still reads its own file.
        // Compare bytes: Swift's String == treats the NFC and NFD spellings as equal.
        let nfd = try #require(
            w.fileWrappers?.values.first { Array(($0.filename ?? "").utf8) == Array("cafe\u{301}".utf8) })
        #expect(try nfd.contents() == Data("nfd".utf8))
    }

    @Test("Attributes from disk: permissions, owner, modification date, user xattrs")
    func attributesFromDisk() throws {
        let tmp = try TemporaryDirectory()
        let url = try tmp.write("f.txt", "x")
        chmod(url.path, 0o640)
        #expect(setxattr(url.path, "user.color", "blue", 4, 0) == 0)
        let w = try FileWrapper(url: url)
        #expect(w.posixPermissions == 0o640)
        #expect(w.fileAttributes[.ownerAccountID] as? Int == Int(getuid()))
        #expect(w.fileAttributes[.groupOwnerAccountID] as? Int == Int(getgid()))
        #expect(w.modificationDate == (try FileFacts(url.path)).mtime)
        #expect(w.extendedAttributes == ["user.color": Data("blue".utf8)])
    }

    @Test("Unsupported items and names that are not UTF-8 give clear errors")
    func badItems() throws {
        let tmp = try TemporaryDirectory()
        try tmp.mkdir("pkg")
        #expect(mkfifo(tmp.path("fifo"), 0o644) == 0)
        // A fifo is a special-file wrapper, neither of Apple's three kinds.
        let fifo = try FileWrapper(url: tmp.url("fifo"))
        #expect(fifo.kind == .fifo && fifo.isSpecialFile)
        #expect(!fifo.isRegularFile && !fifo.isDirectory && !fifo.isSymbolicLink)
        #expect(fifo.regularFileContents == nil && fifo.fileWrappers == nil && fifo.deviceIdentifier == nil)
        #expect(throws: FileWrapperError.self) { try FileWrapper(url: tmp.url("missing")) }
        let bad = tmp.path("pkg") + "/bad\u{FF}name"
        var raw = Array(tmp.path("pkg").utf8) + Array("/bad".utf8) + [0xFF] + Array("name".utf8) + [0]
        let fd = raw.withUnsafeMutableBufferPointer { buf in
            buf.withMemoryRebound(to: CChar.self) { open($0.baseAddress!, O_CREAT | O_WRONLY, 0o644) }
        }
        #expect(fd >= 0)
        close(fd)
        _ = bad
        let w = try FileWrapper(url: tmp.url("pkg"))
        #expect(throws: FileWrapperError.nameNotUTF8(directory: tmp.path("pkg"), escapedName: "bad\\xFFname"))
        {
            try w.children()
        }
        #expect(w.fileWrappers == nil)
    }
}
