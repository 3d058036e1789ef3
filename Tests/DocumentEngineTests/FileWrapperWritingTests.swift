import CLinuxSupport
import Foundation
import Testing
import TestSupport

@testable import DocumentEngine

#if canImport(Glibc)
    import Glibc
#endif

/// Writing: W-1..W-10, LX-1, LX-3 (docs/library/apple-behaviours.md), and the incremental-save
/// guarantee.
@Suite struct FileWrapperWritingTests {
    /// A package of `count` images plus an archive, written once and read back lazily.
    func makeImagePackage(in tmp: TemporaryDirectory, count: Int, size: Int = 64 * 1024) throws -> URL {
        let package = FileWrapper(directoryWithFileWrappers: [:])
        for i in 0..<count {
            package.addRegularFile(
                withContents: sampleBytes(size, seed: UInt64(i)), preferredFilename: "image\(i).png")
        }
        package.addRegularFile(withContents: Data("archive".utf8), preferredFilename: "things.data")
        let url = tmp.url("Images.pkg")
        try package.write(to: url, options: .atomic)
        return url
    }

    @Test("W-6: replacing one image of 100 writes one file's bytes and keeps the other 99 inodes")
    func incrementalSave() throws {
        let tmp = try TemporaryDirectory()
        let url = try makeImagePackage(in: tmp, count: 100)
        let before = try (0..<100).map { try FileFacts(url.appendingPathComponent("image\($0).png").path) }

        let package = try FileWrapper(url: url)
        let old = try #require(package.fileWrappers?["image42.png"])
        package.removeFileWrapper(old)
        let replacement = sampleBytes(64 * 1024, seed: 4242)
        package.addRegularFile(withContents: replacement, preferredFilename: "image42.png")
        let report = try package.write(
            to: url, options: [.atomic, .withNameUpdating], originalContentsURL: url)

        #expect(report.regularFilesWritten == 1)
        #expect(report.bytesWritten == Int64(replacement.count))
        #expect(report.regularFilesLinked == 100)  // 99 images + things.data
        #expect(report.replacement == .exchanged)
        for i in 0..<100 {
            let after = try FileFacts(url.appendingPathComponent("image\(i).png").path)
            if i == 42 {
                #expect(after.inode != before[i].inode)
            } else {
                #expect(after.inode == before[i].inode, "image\(i).png was rewritten")
                #expect(after.links == 1)  // the old package is gone, only the new link remains
            }
        }
        #expect(try Data(contentsOf: url.appendingPathComponent("image42.png")) == replacement)
        #expect(try tmp.entries() == ["Images.pkg"])  // no temporary folder left behind

        // A second save with nothing changed writes no bytes at all.
        let again = try package.write(
            to: url, options: [.atomic, .withNameUpdating], originalContentsURL: url)
        #expect(again.bytesWritten == 0 && again.regularFilesLinked == 101)
    }

    @Test("W-6: nested directories are linked level by level")
    func incrementalNested() throws {
        let tmp = try TemporaryDirectory()
        try tmp.write("doc/Resources/a.bin", sampleBytes(1000, seed: 1))
        try tmp.write("doc/Resources/Deep/b.bin", sampleBytes(1000, seed: 2))
        try tmp.write("doc/top.txt", "top")
        let url = tmp.url("doc")
        let inodeB = try FileFacts(tmp.path("doc/Resources/Deep/b.bin")).inode
        let w = try FileWrapper(url: url)
        w.addRegularFile(withContents: Data("new".utf8), preferredFilename: "new.txt")
        let report = try w.write(to: url, options: .atomic, originalContentsURL: url)
        #expect(report.regularFilesWritten == 1 && report.bytesWritten == 3)
        #expect(report.regularFilesLinked == 3)
        #expect(try FileFacts(tmp.path("doc/Resources/Deep/b.bin")).inode == inodeB)
    }

    @Test("W-6/FW-6: a wrapper whose attributes were set is written, not linked")
    func attributesDisableLinking() throws {
        let tmp = try TemporaryDirectory()
        try tmp.write("doc/a.txt", "a")
        try tmp.write("doc/b.txt", "b")
        let url = tmp.url("doc")
        let w = try FileWrapper(url: url)
        let a = try #require(w.fileWrappers?["a.txt"])
        var attributes = a.fileAttributes
        attributes[.posixPermissions] = 0o600
        a.fileAttributes = attributes
        let report = try w.write(to: url, options: .atomic, originalContentsURL: url)
        #expect(report.regularFilesWritten == 1 && report.regularFilesLinked == 1)
        #expect(try FileFacts(tmp.path("doc/a.txt")).permissions == 0o600)
        #expect(try Data(contentsOf: tmp.url("doc/a.txt")) == Data("a".utf8))
    }

    @Test("W-6: a file changed on disk since it was read is not linked")
    func staleOriginalNotLinked() throws {
        let tmp = try TemporaryDirectory()
        try tmp.write("doc/a.txt", "original")
        let url = tmp.url("doc")
        let w = try FileWrapper(url: url, options: .immediate)
        try tmp.write("doc/a.txt", "someone else's edit")
        try setModificationDate(tmp.path("doc/a.txt"), Date().addingTimeInterval(100))
        try w.write(to: url, options: .atomic, originalContentsURL: url)
        #expect(try Data(contentsOf: tmp.url("doc/a.txt")) == Data("original".utf8))
    }

    @Test(
        "LX-3: when link() fails (another file system) unchanged files are copied",
        .enabled(if: FileManager.default.fileExists(atPath: "/dev/shm")))
    func linkFallsBackToCopy() throws {
        let shm = try TemporaryDirectory(base: "/dev/shm")
        let tmp = try TemporaryDirectory()
        let original = try makeImagePackage(in: shm, count: 5, size: 1000)
        guard try FileFacts(shm.path).inode != 0,
            (try? FileManager.default.attributesOfFileSystem(forPath: shm.path)[.systemNumber] as? Int)
                != (try? FileManager.default.attributesOfFileSystem(forPath: tmp.path)[.systemNumber] as? Int)
        else { return }
        let w = try FileWrapper(url: original)
        let target = tmp.url("Copy.pkg")
        let report = try w.write(to: target, options: .atomic, originalContentsURL: original)
        #expect(report.regularFilesLinked == 0)
        #expect(report.regularFilesWritten == 6)
        #expect(
            try Data(contentsOf: target.appendingPathComponent("image3.png")) == sampleBytes(1000, seed: 3))
    }

    @Test("W-1: a non-atomic directory write fails over an existing item; a file is overwritten")
    func nonAtomic() throws {
        let tmp = try TemporaryDirectory()
        try tmp.mkdir("exists")
        let d = FileWrapper(directoryWithFileWrappers: [:])
        #expect(throws: FileWrapperError.writeFailed(path: tmp.path("exists"), .fileExists)) {
            try d.write(to: tmp.url("exists"))
        }
        let url = try tmp.write("flat.txt", "old contents that are longer")
        try FileWrapper(regularFileWithContents: Data("new".utf8)).write(to: url)
        #expect(try Data(contentsOf: url) == Data("new".utf8))
        let report = try d.write(to: tmp.url("fresh"))
        #expect(report.replacement == .none && report.directoriesCreated == 1)
    }

    @Test("W-1: a lazily read file written onto itself keeps its bytes")
    func selfOverwrite() throws {
        let tmp = try TemporaryDirectory()
        let url = try tmp.write("self.txt", "keep me")
        let w = try FileWrapper(url: url)
        try w.write(to: url)
        #expect(try Data(contentsOf: url) == Data("keep me".utf8))
        try w.write(to: url, options: .atomic)
        #expect(try Data(contentsOf: url) == Data("keep me".utf8))
        #expect(try w.contents() == Data("keep me".utf8))
    }

    @Test("W-2: an atomic write creates, or swaps in place of, a package of another kind")
    func atomicReplacesAnyKind() throws {
        let tmp = try TemporaryDirectory()
        let url = tmp.url("doc")
        let created = try FileWrapper(regularFileWithContents: Data("flat".utf8)).write(
            to: url, options: .atomic)
        #expect(created.replacement == .renamed)
        let package = FileWrapper(directoryWithFileWrappers: [:])
        package.addRegularFile(withContents: Data("t".utf8), preferredFilename: "Text.txt")
        let swapped = try package.write(to: url, options: .atomic)
        #expect(swapped.replacement == .exchanged)
        #expect(try tmp.entries("doc") == ["Text.txt"])
        #expect(try tmp.entries() == ["doc"])
    }

    @Test("W-2: a failed atomic write leaves the previous version intact and no debris")
    func failedAtomicWrite() throws {
        let tmp = try TemporaryDirectory()
        try tmp.write("doc/a.txt", "precious")
        let url = tmp.url("doc")
        let w = try FileWrapper(url: url)
        // A lazily read file that vanished cannot be written (W-10).
        try tmp.write("src/ghost.txt", "boo")
        let ghostDir = try FileWrapper(url: tmp.url("src"))
        let ghost = try #require(ghostDir.fileWrappers?["ghost.txt"])
        ghostDir.removeFileWrapper(ghost)
        try FileManager.default.removeItem(atPath: tmp.path("src/ghost.txt"))
        w.addFileWrapper(ghost)
        #expect { try w.write(to: url, options: .atomic, originalContentsURL: url) } throws: { error in
            guard case .missingContents(let path, _) = error as? FileWrapperError else { return false }
            return path.hasSuffix("ghost.txt")
        }
        #expect(try Data(contentsOf: tmp.url("doc/a.txt")) == Data("precious".utf8))
        #expect(try tmp.entries() == ["doc", "src"])
        #expect(try tmp.entries("doc") == ["a.txt"])
    }

    @Test("LX-1: without RENAME_EXCHANGE a package is moved aside and replaced; a file is renamed over")
    func fallbackWithoutExchange() throws {
        let tmp = try TemporaryDirectory()
        try tmp.write("doc/a.txt", "a")
        let url = tmp.url("doc")
        let w = try FileWrapper(url: url)
        w.addRegularFile(withContents: Data("b".utf8), preferredFilename: "b.txt")
        let report = try ScratchArea.$simulatedMissingExchange.withValue(true) {
            try w.write(to: url, options: .atomic, originalContentsURL: url)
        }
        #expect(report.replacement == .movedAside)
        #expect(try tmp.entries("doc") == ["a.txt", "b.txt"])
        #expect(try tmp.entries() == ["doc"])  // the old package and the scratch folder are gone

        let flat = try tmp.write("flat.txt", "old")
        let inode = try FileFacts(flat.path).inode
        let fileReport = try ScratchArea.$simulatedMissingExchange.withValue(true) {
            try FileWrapper(regularFileWithContents: Data("new".utf8)).write(to: flat, options: .atomic)
        }
        #expect(fileReport.replacement == .exchanged)  // rename(2) over a file is atomic
        #expect(try Data(contentsOf: flat) == Data("new".utf8))
        #expect(try FileFacts(flat.path).inode != inode)
        #expect(try tmp.entries() == ["doc", "flat.txt"])
    }

    @Test("W-3: permissions less the umask, modification date, and xattrs are applied")
    func attributesApplied() throws {
        let tmp = try TemporaryDirectory()
        let date = Date(timeIntervalSince1970: 1_500_000_000.25)
        let file = FileWrapper(regularFileWithContents: Data("x".utf8))
        file.fileAttributes = [
            .type: FileAttributeType.typeRegular, .posixPermissions: 0o666, .modificationDate: date,
            .extendedAttributes: ["user.note": Data("hello".utf8)],
        ]
        file.preferredFilename = "f.txt"
        let link = FileWrapper(symbolicLinkWithDestination: "f.txt")
        link.preferredFilename = "link"
        let dir = FileWrapper(directoryWithFileWrappers: ["f.txt": file, "link": link])
        try dir.write(to: tmp.url("pkg"), options: .atomic)
        let facts = try FileFacts(tmp.path("pkg/f.txt"))
        #expect(facts.permissions == 0o666 & ~processUmask())
        #expect(abs(facts.mtime.timeIntervalSince(date)) < 0.001)
        var buffer = [UInt8](repeating: 0, count: 16)
        let n = getxattr(tmp.path("pkg/f.txt"), "user.note", &buffer, 16)
        #expect(n == 5 && Array(buffer[0..<5]) == Array("hello".utf8))
        #expect(try FileManager.default.destinationOfSymbolicLink(atPath: tmp.path("pkg/link")) == "f.txt")
        #expect(try FileFacts(tmp.path("pkg")).permissions == 0o777 & ~processUmask())
    }

    @Test("W-7/W-9/FW-9: names on disk are keys; .withNameUpdating sets descendants' filename")
    func nameUpdating() throws {
        let tmp = try TemporaryDirectory()
        let dir = FileWrapper(directoryWithFileWrappers: [:])
        let first = FileWrapper(regularFileWithContents: Data("1".utf8))
        first.preferredFilename = "same.txt"
        let second = FileWrapper(regularFileWithContents: Data("2".utf8))
        second.preferredFilename = "same.txt"
        dir.addFileWrapper(first)
        dir.addFileWrapper(second)
        try dir.write(to: tmp.url("plain"))
        #expect(first.filename == nil && second.filename == nil)
        #expect(try tmp.entries("plain") == ["1__#$!@%!#__same.txt", "same.txt"])
        try dir.write(to: tmp.url("named"), options: .withNameUpdating)
        #expect(first.filename == "same.txt")
        #expect(second.filename == "1__#$!@%!#__same.txt")
        #expect(dir.filename == nil)  // the receiver's own filename is untouched
        #expect(second.preferredFilename == "same.txt")
    }

    @Test("W-7: lazily read files follow the package after an atomic save with name updating")
    func lazySourcesFollowSave() throws {
        let tmp = try TemporaryDirectory()
        try tmp.write("doc/a.txt", "alpha")
        let url = tmp.url("doc")
        let w = try FileWrapper(url: url)
        let a = try #require(w.fileWrappers?["a.txt"])
        a.preferredFilename = "renamed.txt"  // its key changes, so its file moves
        try w.write(to: url, options: [.atomic, .withNameUpdating], originalContentsURL: url)
        #expect(try tmp.entries("doc") == ["renamed.txt"])
        #expect(try a.contents() == Data("alpha".utf8))
        // And the next incremental save links it again.
        w.addRegularFile(withContents: Data(), preferredFilename: "b.txt")
        let report = try w.write(to: url, options: [.atomic, .withNameUpdating], originalContentsURL: url)
        #expect(report.regularFilesLinked == 1)
    }

    @Test("Writing validates names before touching the disk")
    func invalidKeys() throws {
        let tmp = try TemporaryDirectory()
        let dir = FileWrapper(directoryWithFileWrappers: [:])
        let bad = FileWrapper(regularFileWithContents: Data())
        bad.preferredFilename = "../escape"
        dir.addFileWrapper(bad)
        #expect(throws: FileWrapperError.invalidFilename("../escape", reason: "it contains a slash")) {
            try dir.write(to: tmp.url("pkg"), options: .atomic)
        }
        #expect(try tmp.entries().isEmpty)
        #expect(
            !FileManager.default.fileExists(
                atPath: tmp.url.deletingLastPathComponent().appendingPathComponent("escape").path))
    }

    @Test("Large contents are streamed from their source, not loaded")
    func streamingWrite() throws {
        let tmp = try TemporaryDirectory()
        struct Pattern: ContentsSource {
            let count: Int64
            func read(offset: Int64, count: Int) throws -> Data {
                let n = Int(max(0, min(Int64(count), self.count - offset)))
                return Data((0..<n).map { UInt8(truncatingIfNeeded: (offset + Int64($0)) % 251) })
            }
            func data() throws -> Data {
                Issue.record("whole contents were requested")
                return Data()
            }
        }
        let size: Int64 = 5 << 20 + 17
        let w = FileWrapper(regularFileWithContentsSource: Pattern(count: size))
        let report = try w.write(to: tmp.url("stream.bin"))
        #expect(report.bytesWritten == size)
        let back = try FileWrapper(url: tmp.url("stream.bin"))
        #expect(
            try back.readContents(offset: size - 3, count: 3)
                == (try Pattern(count: size).read(offset: size - 3, count: 3)))
    }
}
