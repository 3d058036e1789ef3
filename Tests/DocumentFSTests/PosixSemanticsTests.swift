import CLinuxSupport
import DocumentEngine
import DocumentFS
import Foundation
import Synchronization
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

let renameNoReplace: UInt32 = 1  // RENAME_NOREPLACE
let renameExchange: UInt32 = 2  // RENAME_EXCHANGE

/// The default quiet interval after the last change before a background save
/// (`DocumentFileSystem.Configuration.quietInterval`).
let quietInterval = 1.0

/// POSIX details of the write path, through direct syscalls (docs/design/fuse-notes.md §3.6), each
/// checked in the mount and through a second store connection.
@Suite(.serialized)
struct PosixSemanticsTests {
    // MARK: Links and renames

    @Test("link(2): names of one file in a package, links to links, EXDEV from the root; link counts")
    func hardLinks() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        try await withMount(fixture.store) { mount in
            let p = mount.path
            let errors = try await offThread {
                [
                    errnoOf(link(p + "/Work.pkg/notes.txt", p + "/Work.pkg/hard")),
                    errnoOf(link(p + "/Work.pkg/notes.txt", p + "/Work.pkg/sub/hard")),
                    errnoOf(link(p + "/Flat.txt", p + "/Hard.txt")),
                    // Without AT_SYMLINK_FOLLOW the link itself gets another name.
                    errnoOf(linkat(AT_FDCWD, p + "/Work.pkg/link", AT_FDCWD, p + "/Work.pkg/symhard", 0)),
                ]
            }
            #expect(errors == [0, 0, EXDEV, 0])
            #expect(
                try await offThread { try entries(in: p + "/Work.pkg") } == [
                    "hard", "link", "notes.txt", "sub", "symhard",
                ])
            let symlinkTarget = try await offThread { () throws -> String in
                var buffer = [CChar](repeating: 0, count: 64)
                let count = try sys(readlink(p + "/Work.pkg/symhard", &buffer, 63))
                return String(decoding: buffer[0..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
            }
            #expect(symlinkTarget == "notes.txt")
            // nlink: the names of a file; 2 + subdirectories for directories (vim copies when nlink > 1).
            let links = try await offThread {
                try [
                    lstatOf(p + "/Work.pkg/notes.txt").st_nlink, lstatOf(p + "/Flat.txt").st_nlink,
                    lstatOf(p + "/Work.pkg").st_nlink, lstatOf(p + "/Work.pkg/sub").st_nlink,
                    lstatOf(p + "/Work.pkg/link").st_nlink,
                ]
            }
            #expect(links == [3, 1, 3, 2, 2])
            try await offThread { try sys(mkdir(p + "/Work.pkg/sub/x", 0o755)) }
            #expect(try await offThread { try lstatOf(p + "/Work.pkg/sub").st_nlink } == 3)
        }
    }

    @Test("a package's link count counts its folders once it is read, though stat saw it before")
    func packageLinkCountAfterLoading() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        try await withMount(fixture.store) { mount in
            let p = mount.path
            // The first stat finds the package unread; the kernel keeps what it answered.
            _ = try await offThread { try lstatOf(p + "/Work.pkg") }
            let sub = try await offThread { try lstatOf(p + "/Work.pkg/sub").st_nlink }
            #expect(sub == 2)
            // The mount tells the kernel to forget the old count, a moment after the lookup.
            try await expectEventually("Work.pkg shows 3 links") {
                try lstatOf(p + "/Work.pkg").st_nlink == 3
            }
        }
    }

    @Test(
        "rename across documents, or between a package and the root, moves; only an exchange across documents is EXDEV"
    )
    func crossDocumentRename() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let engine = try Engine(fixture)
        try await withMount(fixture.store) { mount in
            let p = mount.path
            let errors = try await offThread {
                [
                    errnoOf(
                        docfs_renameat2(
                            AT_FDCWD, p + "/Work.pkg/notes.txt", AT_FDCWD, p + "/Other.pkg/other.txt",
                            renameExchange)),
                    errnoOf(rename(p + "/Work.pkg/notes.txt", p + "/Other.pkg/notes.txt")),
                    errnoOf(rename(p + "/Work.pkg/sub", p + "/Other.pkg/sub")),
                    errnoOf(rename(p + "/Flat.txt", p + "/Work.pkg/Flat.txt")),
                    errnoOf(rename(p + "/Other.pkg/sub", p + "/Sub.pkg")),
                ]
            }
            #expect(errors == [0, 0, 0, 0, 0])
        }
        // The exchange put other.txt under Work.pkg's notes.txt and notes.txt under Other.pkg's
        // other.txt; the move then took the first to Other.pkg as notes.txt.
        #expect(try engine.paths("Work.pkg") == ["Flat.txt", "link"])
        #expect(try engine.paths("Other.pkg") == ["notes.txt", "other.txt"])
        #expect(try engine.text("Other.pkg", "notes.txt") == Fixture.otherText)
        #expect(try engine.text("Other.pkg", "other.txt") == Fixture.notesText)
        #expect(try engine.paths("Sub.pkg") == ["inner.txt"])
        #expect(try engine.documentNames() == ["Other.pkg", "Sub.pkg", "Work.pkg"])
    }

    @Test("a name that is an existing name's text in another Unicode form fails with EEXIST")
    func equivalentNames() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        try await withMount(fixture.store) { mount in
            let w = mount.url("Work.pkg")
            let results = try await offThread { () -> [Int32] in
                func create(_ name: String) -> Int32 {
                    let fd = open(w + "/" + name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o644)
                    if fd < 0 { return errno }
                    close(fd)
                    return 0
                }
                // NFC then NFD é; the Kelvin sign then the ASCII K it is canonically; k is other text.
                return [
                    create("caf\u{E9}.txt"), create("cafe\u{301}.txt"), create("\u{212A}.txt"),
                    create("K.txt"), create("k.txt"),
                ]
            }
            #expect(results == [0, EEXIST, 0, EEXIST, 0])
        }
    }

    @Test("renameat2 RENAME_NOREPLACE fails with EEXIST on an existing name and renames otherwise")
    func renameNoReplaceFlag() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let engine = try Engine(fixture)
        let notes = try #require(try engine.record("Work.pkg", "notes.txt"))
        try await withMount(fixture.store) { mount in
            let w = mount.url("Work.pkg")
            let exists = try await offThread {
                errnoOf(
                    docfs_renameat2(
                        AT_FDCWD, w + "/notes.txt", AT_FDCWD, w + "/sub/inner.txt", renameNoReplace))
            }
            #expect(exists == EEXIST)
            #expect(try await offThread { try readText(w + "/sub/inner.txt") } == Fixture.innerText)
            #expect(try await offThread { try readText(w + "/notes.txt") } == Fixture.notesText)
            let documents = try await offThread {
                errnoOf(
                    docfs_renameat2(
                        AT_FDCWD, mount.url("Flat.txt"), AT_FDCWD, mount.url("Work.pkg"), renameNoReplace))
            }
            #expect(documents == EEXIST)
            let moved = try await offThread {
                errnoOf(
                    docfs_renameat2(
                        AT_FDCWD, w + "/notes.txt", AT_FDCWD, w + "/sub/notes.txt", renameNoReplace))
            }
            #expect(moved == 0)
            try await expectEventually("the rename") {
                try engine.record("Work.pkg", "sub/notes.txt")?.id == notes.id
            }
            #expect(try engine.text("Work.pkg", "sub/inner.txt") == Fixture.innerText)
            #expect(try engine.paths("Work.pkg") == ["link", "sub", "sub/inner.txt", "sub/notes.txt"])
        }
    }

    @Test("renameat2 RENAME_EXCHANGE swaps two names atomically, files and directories")
    func renameExchangeFlag() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let engine = try Engine(fixture)
        let notes = try #require(try engine.record("Work.pkg", "notes.txt"))
        let inner = try #require(try engine.record("Work.pkg", "sub/inner.txt"))
        try await withMount(fixture.store) { mount in
            let w = mount.url("Work.pkg")
            let swapped = try await offThread {
                errnoOf(
                    docfs_renameat2(
                        AT_FDCWD, w + "/notes.txt", AT_FDCWD, w + "/sub/inner.txt", renameExchange))
            }
            #expect(swapped == 0)
            #expect(try await offThread { try readText(w + "/notes.txt") } == Fixture.innerText)
            #expect(try await offThread { try readText(w + "/sub/inner.txt") } == Fixture.notesText)
            try await expectEventually("the exchange in the store") {
                try engine.record("Work.pkg", "notes.txt")?.id == inner.id
                    && engine.record("Work.pkg", "sub/inner.txt")?.id == notes.id
            }
            #expect(try engine.text("Work.pkg", "notes.txt") == Fixture.innerText)
            #expect(try engine.text("Work.pkg", "sub/inner.txt") == Fixture.notesText)
            // A file and a directory.
            let mixed = try await offThread {
                errnoOf(docfs_renameat2(AT_FDCWD, w + "/notes.txt", AT_FDCWD, w + "/sub", renameExchange))
            }
            #expect(mixed == 0)
            #expect(try await offThread { try entries(in: w + "/notes.txt") } == ["inner.txt"])
            #expect(try await offThread { try readText(w + "/sub") } == Fixture.innerText)
            try await expectEventually("the second exchange in the store") {
                try engine.record("Work.pkg", "sub")?.id == inner.id
                    && engine.record("Work.pkg", "notes.txt/inner.txt")?.id == notes.id
            }
            // Exchange with a missing name: ENOENT, nothing changes.
            let missing = try await offThread {
                errnoOf(docfs_renameat2(AT_FDCWD, w + "/sub", AT_FDCWD, w + "/nothing", renameExchange))
            }
            #expect(missing == ENOENT)
        }
    }

    // MARK: Unlinked but open

    @Test("a file unlinked while open stays readable and writable until the last close, and is never saved")
    func unlinkWhileOpen() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let engine = try Engine(fixture)
        try await withMount(fixture.store) { mount in
            let w = mount.url("Work.pkg")
            try await offThread {
                // An existing wrapper, and a new file.
                let oldFile = try OpenedFile(w + "/notes.txt", O_RDWR)
                let newFile = try OpenedFile(w + "/scratch.dat", O_RDWR | O_CREAT | O_EXCL, 0o600)
                let (old, new) = (oldFile.fd, newFile.fd)
                try writeAll(new, "abc")
                try sys(unlink(w + "/notes.txt"), "unlink notes.txt")
                try sys(unlink(w + "/scratch.dat"), "unlink scratch.dat")
                #expect(try entries(in: w) == ["link", "sub"])
                try pwriteAll(old, Array("XYZ".utf8), at: 0)
                try writeAll(new, "def")
                #expect(try preadBytes(old, count: 100, at: 0) == Array("XYZ\ntwo\nthree\n".utf8))
                #expect(try preadBytes(new, count: 100, at: 0) == Array("abcdef".utf8))
                #expect(try fstatOf(old).st_nlink == 0 && fstatOf(old).st_size == 14)
                #expect(try fstatOf(new).st_size == 6)
                // fsync of an unlinked file succeeds and saves nothing; then a quiet interval
                // passes with both still open and changed.
                #expect(fsync(old) == 0)
                usleep(useconds_t((quietInterval + 0.5) * 1_000_000))
                try pwriteAll(old, Array("!".utf8), at: 14)
                #expect(try preadBytes(old, count: 100, at: 10) == Array("ree\n!".utf8))
                #expect(oldFile.close() == 0)
                #expect(newFile.close() == 0)
            }
            try await expectEventually("the unlink in the store") {
                try engine.paths("Work.pkg") == ["link", "sub", "sub/inner.txt"]
            }
            _ = try await offThread { usleep(useconds_t((quietInterval + 0.3) * 1_000_000)) }
            // No version ever held the writes made after the unlink.
            let work = try engine.document("Work.pkg")
            for version in try engine.store.versions(of: work.id) {
                let tree = try engine.tree(of: work.id, at: version.id)
                if tree["notes.txt"] != nil {
                    #expect(try engine.text(of: work.id, "notes.txt", at: version.id) == Fixture.notesText)
                }
                if let scratch = tree["scratch.dat"] {
                    #expect(scratch.size == 0, "scratch.dat saved in \(version.id)")
                }
            }
            #expect(try engine.paths("Work.pkg") == ["link", "sub", "sub/inner.txt"])
        }
    }

    @Test(
        "a document deleted while open stays readable and writable; the store keeps it restorable as it was")
    func deleteOpenDocument() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let engine = try Engine(fixture)
        let flat = try engine.document("Flat.txt")
        try await withMount(fixture.store) { mount in
            let p = mount.path
            try await offThread {
                let file = try OpenedFile(p + "/Flat.txt", O_RDWR)
                let fd = file.fd
                try sys(unlink(p + "/Flat.txt"), "unlink")
                #expect(try entries(in: p) == ["Other.pkg", "Work.pkg"])
                try pwriteAll(fd, Array("ALPHA".utf8), at: 0)
                #expect(try preadBytes(fd, count: 100, at: 0) == Array("ALPHA\nbeta\n".utf8))
                #expect(fsync(fd) == 0)
                #expect(file.close() == 0)
            }
            try await expectEventually("the deletion") { try engine.store.document(named: "Flat.txt") == nil }
            #expect(try engine.store.deletedDocuments().contains { $0.id == flat.id })
            _ = try await offThread { usleep(useconds_t((quietInterval + 0.3) * 1_000_000)) }
            // Restored, it has the contents it had when it was deleted, not the later writes.
            _ = try engine.store.undeleteDocument(flat.id, as: nil)
            #expect(try engine.text("Flat.txt") == Fixture.flatText)
        }
    }

    @Test("a file renamed over while open keeps reading its own bytes; a handle's writes follow a rename")
    func openFilesAcrossRenames() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let engine = try Engine(fixture)
        try await withMount(fixture.store) { mount in
            let w = mount.url("Work.pkg")
            try await offThread {
                // A reader of notes.txt while sed -i-style replaces it.
                let readerFile = try OpenedFile(w + "/notes.txt", O_RDONLY)
                let reader = readerFile.fd
                #expect(try preadBytes(reader, count: 3, at: 0) == Array("one".utf8))
                try writeText(w + "/sedAAAAAA", "replacement\n")
                try sys(rename(w + "/sedAAAAAA", w + "/notes.txt"), "rename onto notes.txt")
                #expect(try preadBytes(reader, count: 100, at: 0) == Array(Fixture.notesText.utf8))
                #expect(try readText(w + "/notes.txt") == "replacement\n")

                // A writer whose file is renamed, and moved to another directory, meanwhile.
                let writerFile = try OpenedFile(w + "/sub/inner.txt", O_WRONLY | O_APPEND)
                let writer = writerFile.fd
                try writeAll(writer, "first\n")
                try sys(rename(w + "/sub/inner.txt", w + "/moved.txt"), "rename inner.txt")
                try writeAll(writer, "second\n")
                #expect(writerFile.close() == 0)
                readerFile.close()
            }
            // The rename onto notes.txt is a save point that the committer commits.
            try await expectEventually("the replacement saved") {
                try engine.text("Work.pkg", "notes.txt") == "replacement\n"
            }
            try await expectEventually("the moved file with both writes") {
                try engine.text("Work.pkg", "moved.txt") == Fixture.innerText + "first\nsecond\n"
                    && engine.record("Work.pkg", "sub/inner.txt") == nil
            }
        }
    }

    @Test("a small change in a big file saves only the chunk it touches")
    func incrementalSave() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let engine = try Engine(fixture)
        let chunk = Fixture.chunkSize
        let bytes = sampleBytes(4 * chunk + 1000, seed: 3)
        try await withMount(fixture.store) { mount in
            let path = mount.url("Work.pkg/big.bin")
            try await offThread {
                let file = try OpenedFile(path, O_WRONLY | O_CREAT | O_EXCL, 0o644)
                try bytes.withUnsafeBytes { raw in
                    let n = try sys(write(file.fd, raw.baseAddress!, raw.count), "write")
                    #expect(n == raw.count)
                }
                #expect(file.close() == 0)
            }
            try await expectEventually("the file in the store") {
                try engine.contents("Work.pkg", "big.bin") == bytes
            }
            let written = fixture.store.statistics.bytesWritten
            try await offThread {
                let file = try OpenedFile(path, O_RDWR)
                try pwriteAll(file.fd, Array("patched".utf8), at: 2 * chunk + 100)
                #expect(file.close() == 0)
            }
            var expected = bytes
            expected.replaceSubrange((2 * chunk + 100)..<(2 * chunk + 107), with: Data("patched".utf8))
            let patched = expected
            try await expectEventually("the patch in the store") {
                try engine.contents("Work.pkg", "big.bin") == patched
            }
            let delta = fixture.store.statistics.bytesWritten - written
            #expect(delta <= Int64(chunk), "a 7-byte change wrote \(delta) bytes")
        }
    }

    @Test("writes through a shared mmap are saved")
    func mmapWrites() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let engine = try Engine(fixture)
        try await withMount(fixture.store) { mount in
            let path = mount.url("Work.pkg/notes.txt")
            try await offThread {
                let file = try OpenedFile(path, O_RDWR)
                let fd = file.fd
                guard let map = mmap(nil, 14, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), map != MAP_FAILED
                else {
                    throw SyscallError(errno: errno, what: "mmap")
                }
                let bytes = map.assumingMemoryBound(to: UInt8.self)
                #expect(bytes[0] == UInt8(ascii: "o"))
                for (i, c) in "ONE".utf8.enumerated() { bytes[i] = c }
                try sys(msync(map, 14, MS_SYNC), "msync")
                munmap(map, 14)
                try sys(fsync(fd), "fsync")
                #expect(file.close() == 0)
            }
            #expect(try engine.text("Work.pkg", "notes.txt") == "ONE\ntwo\nthree\n")
        }
    }

    @Test("threads writing different files of one document at once: every file saved whole, the store intact")
    func concurrentWriters() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let engine = try Engine(fixture)
        try await withMount(fixture.store) { mount in
            let w = mount.url("Work.pkg")
            try await withThrowingTaskGroup(of: Void.self) { group in
                for writer in 0..<6 {
                    group.addTask {
                        try await offThread {
                            for round in 0..<8 {
                                let text = String(
                                    repeating: "writer \(writer) round \(round)\n", count: 50 + writer)
                                try writeText(w + "/w\(writer).txt", text)
                            }
                        }
                    }
                }
                try await group.waitForAll()
            }
            for writer in 0..<6 {
                let text = String(repeating: "writer \(writer) round 7\n", count: 50 + writer)
                try await expectEventually("w\(writer).txt") {
                    try engine.text("Work.pkg", "w\(writer).txt") == text
                }
            }
        }
        #expect(try engine.store.checkIntegrity().isClean)
    }

    @Test("a directory renamed while a file in it is open and changed: the close saves it at its new path")
    func renameDirectoryWithOpenFile() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let engine = try Engine(fixture)
        let inner = try #require(try engine.record("Work.pkg", "sub/inner.txt"))
        try await withMount(fixture.store) { mount in
            let w = mount.url("Work.pkg")
            try await offThread {
                let file = try OpenedFile(w + "/sub/inner.txt", O_WRONLY | O_APPEND)
                let fd = file.fd
                try writeAll(fd, "before\n")
                try sys(mkdir(w + "/new", 0o755), "mkdir")
                try sys(rename(w + "/sub", w + "/new/renamed"), "rename sub")
                try writeAll(fd, "after\n")
                #expect(file.close() == 0)
            }
            try await expectEventually("the file at its new path") {
                try engine.text("Work.pkg", "new/renamed/inner.txt") == Fixture.innerText + "before\nafter\n"
            }
            #expect(try engine.record("Work.pkg", "new/renamed/inner.txt")?.id == inner.id)
            #expect(
                try engine.paths("Work.pkg") == [
                    "link", "new", "new/renamed", "new/renamed/inner.txt", "notes.txt",
                ])
        }
    }

    @Test("a scratch file renamed to an ordinary new name becomes a wrapper (or a flat document at the root)")
    func scratchFileRenamedToOrdinaryName() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let engine = try Engine(fixture)
        try await withMount(fixture.store) { mount in
            try await offThread {
                try writeText(mount.url("Work.pkg/.kept.txt.swp"), "was scratch\n")
                try sys(rename(mount.url("Work.pkg/.kept.txt.swp"), mount.url("Work.pkg/kept.txt")), "rename")
                try writeText(mount.url("sedQwErTy"), "was scratch at the root\n")
                try sys(rename(mount.url("sedQwErTy"), mount.url("Kept.txt")), "rename at the root")
            }
            try await expectEventually("the published files") {
                try engine.text("Work.pkg", "kept.txt") == "was scratch\n"
                    && engine.store.document(named: "Kept.txt") != nil
            }
            #expect(try engine.document("Kept.txt").kind == .flat)
            #expect(try engine.text("Kept.txt") == "was scratch at the root\n")
            let scratchInStore = try engine.scratchNamesInStore()
            #expect(scratchInStore == [])
        }
    }

    // MARK: Truncation, append, sparse files

    @Test("ftruncate through a handle and truncate(2) by path, growing and shrinking")
    func truncation() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let engine = try Engine(fixture)
        try await withMount(fixture.store) { mount in
            let notes = mount.url("Work.pkg/notes.txt")
            try await offThread {
                let fd = try openFile(notes, O_RDWR)
                try sys(ftruncate(fd, 3), "ftruncate")
                #expect(try fstatOf(fd).st_size == 3)
                #expect(try preadBytes(fd, count: 10, at: 0) == Array("one".utf8))
                try sys(close(fd), "close")
            }
            // close of a changed file is a save point.
            try await expectEventually("the truncated file") {
                try engine.text("Work.pkg", "notes.txt") == "one"
            }
            try await offThread {
                try sys(truncate(notes, 6), "truncate")
                #expect(try statOf(notes).st_size == 6)
                #expect(try readText(notes) == "one\0\0\0")
                try sys(truncate(mount.url("Flat.txt"), 2), "truncate Flat.txt")
            }
            try await expectEventually("truncate(2) in the store") {
                try engine.text("Work.pkg", "notes.txt") == "one\0\0\0" && engine.text("Flat.txt") == "al"
            }
            // Truncating to the same size, and to zero with O_TRUNC.
            try await offThread {
                let fd = try openFile(notes, O_WRONLY | O_TRUNC)
                #expect(try fstatOf(fd).st_size == 0)
                try sys(close(fd), "close")
            }
            try await expectEventually("the emptied file") { try engine.text("Work.pkg", "notes.txt") == "" }
        }
    }

    @Test("O_APPEND writes at the end, also from two descriptors")
    func append() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let engine = try Engine(fixture)
        try await withMount(fixture.store) { mount in
            let notes = mount.url("Work.pkg/notes.txt")
            let flat = mount.url("Flat.txt")
            try await offThread {
                let a = try openFile(notes, O_WRONLY | O_APPEND)
                let b = try openFile(notes, O_WRONLY | O_APPEND)
                try writeAll(a, "four\n")
                try writeAll(b, "five\n")
                // pwrite on an O_APPEND descriptor appends on Linux.
                try pwriteAll(a, Array("six\n".utf8), at: 0)
                try sys(close(a), "close")
                try sys(close(b), "close")
                let c = try openFile(flat, O_WRONLY | O_APPEND)
                try writeAll(c, "gamma\n")
                try sys(close(c), "close")
            }
            try await expectEventually("the appends in the store") {
                try engine.text("Work.pkg", "notes.txt") == Fixture.notesText + "four\nfive\nsix\n"
                    && engine.text("Flat.txt") == Fixture.flatText + "gamma\n"
            }
            #expect(try await offThread { try readText(notes) } == Fixture.notesText + "four\nfive\nsix\n")
        }
    }

    @Test("a write past the end leaves a hole that reads as zeros, across chunk boundaries")
    func sparse() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let engine = try Engine(fixture)
        // Past the first 256 KiB chunk.
        let offset = Fixture.chunkSize + 40_000
        try await withMount(fixture.store) { mount in
            let path = mount.url("Work.pkg/sparse.bin")
            try await offThread {
                let fd = try openFile(path, O_RDWR | O_CREAT | O_EXCL, 0o644)
                try writeAll(fd, "start")
                try pwriteAll(fd, Array("end".utf8), at: offset)
                #expect(try fstatOf(fd).st_size == offset + 3)
                #expect(try preadBytes(fd, count: 8, at: 1000) == [UInt8](repeating: 0, count: 8))
                #expect(try preadBytes(fd, count: 8, at: offset - 4) == [0, 0, 0, 0] + Array("end".utf8))
                try sys(close(fd), "close")
            }
            var expected = Data("start".utf8)
            expected.append(Data(count: offset - 5))
            expected.append(Data("end".utf8))
            let sparse = expected
            try await expectEventually("the sparse file") {
                try engine.contents("Work.pkg", "sparse.bin") == sparse
            }
            #expect(try await offThread { try Data(contentsOf: URL(fileURLWithPath: path)) } == expected)
        }
    }

    // MARK: Save points

    @Test("fsync returns only when the data is in the store: another connection sees it before close")
    func fsyncIsDurable() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let engine = try Engine(fixture)
        let before = try engine.versions("Work.pkg").count
        try await withMount(fixture.store) { mount in
            let file = try await offThread { () -> OpenedFile in
                let file = try OpenedFile(mount.url("Work.pkg/new.txt"), O_WRONLY | O_CREAT | O_EXCL, 0o644)
                try writeAll(file.fd, "durable\n")
                try sys(fsync(file.fd), "fsync")
                return file
            }
            let fd = file.fd
            // No polling: fsync has returned.
            #expect(try engine.text("Work.pkg", "new.txt") == "durable\n")
            let afterFirst = try engine.versions("Work.pkg").count
            #expect(afterFirst > before)
            try await offThread {
                try writeAll(fd, "more\n")
                try sys(fdatasync(fd), "fdatasync")
            }
            #expect(try engine.text("Work.pkg", "new.txt") == "durable\nmore\n")
            // Nothing changed since: close saves nothing more.
            try await offThread { try sys(file.close(), "close") }
            let afterClose = try engine.versions("Work.pkg").count
            _ = try await offThread { usleep(useconds_t((quietInterval + 0.3) * 1_000_000)) }
            #expect(try engine.versions("Work.pkg").count == afterClose)
            // A flat document too.
            try await offThread {
                let flatFile = try OpenedFile(mount.url("Flat.txt"), O_WRONLY | O_TRUNC)
                try writeAll(flatFile.fd, "synced\n")
                try sys(fsync(flatFile.fd), "fsync Flat.txt")
                #expect(try engine.text("Flat.txt") == "synced\n")
            }
        }
    }

    @Test("fsync returns after a durable save: the store is on disk, not only visible (fuse-notes §3.6)")
    func fsyncWaitsForTheDisk() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let proxy = ProxyStore(fixture.store)
        try await withMount(proxy) { mount in
            let calls = try await offThread { () -> [String] in
                let file = try OpenedFile(mount.url("Work.pkg/notes.txt"), O_WRONLY | O_APPEND)
                // (Counted from before the write: another suite's spawn may FLUSH, and so save,
                // the change before the fsync.)
                let before = proxy.calls.count
                try writeAll(file.fd, "more\n")
                try sys(fsync(file.fd), "fsync")
                let calls = Array(proxy.calls.dropFirst(before))
                try sys(file.close(), "close")
                return calls
            }
            // The change was saved by this fsync, and the last thing before it returned made
            // every save durable.
            #expect(calls.contains { $0.hasSuffix("save") }, "\(calls)")
            #expect(calls.last == "save" || calls.last == "synchronize", "\(calls)")
        }
    }

    @Test("close of a changed file is committed by the group committer at once; a clean close saves nothing")
    func closeSaves() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let engine = try Engine(fixture)
        try await withMount(fixture.store) { mount in
            let versions = try engine.versions("Work.pkg").count
            // Opened for writing, read, closed: no change, no save.
            try await offThread {
                let fd = try openFile(mount.url("Work.pkg/notes.txt"), O_RDWR)
                _ = try preadBytes(fd, count: 100, at: 0)
                try sys(close(fd), "close")
            }
            #expect(try engine.versions("Work.pkg").count == versions)
            try await offThread {
                try writeText(mount.url("Work.pkg/notes.txt"), "closed\n")
                try writeText(mount.url("Flat.txt"), "closed flat\n")
                try writeText(mount.url("Work.pkg/sub/created.txt"), "created\n", mode: 0o600)
            }
            // Close returns without waiting for the store; the committer commits within moments
            // (well before the quiet interval of a second).
            let took = try await waitUntil(timeout: 3) {
                try engine.text("Work.pkg", "notes.txt") == "closed\n"
                    && engine.text("Flat.txt") == "closed flat\n"
                    && engine.text("Work.pkg", "sub/created.txt") == "created\n"
            }
            #expect(took.map { $0 < 0.5 } == true, "committed after \(took.map { "\($0) s" } ?? "never")")
            #expect(try engine.record("Work.pkg", "sub/created.txt")?.permissions == 0o600)
            #expect(try engine.record("Work.pkg", "notes.txt")?.permissions == 0o640)
        }
    }

    // One case at a time: each times a quiet interval, which a busy machine stretches.
    @Test(
        "a quiet interval saves an open file without close, keeping its mtime and inode (writeback cache off, on)",
        .serialized, arguments: [false, true])
    func quietIntervalSave(_ writebackCache: Bool) async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let engine = try Engine(fixture)
        // Three seconds, against changes 0.4 s apart: a loaded machine (the whole suite at once)
        // can stretch a step past one second, and a save in between is not what this checks.
        let quiet = 3.0
        try await withMount(
            fixture.store,
            configure: {
                $0.fileSystem.writebackCache = writebackCache
                $0.fileSystem.quietInterval = .seconds(quiet)
            }
        ) { mount in
            let notes = mount.url("Work.pkg/notes.txt")
            let versions = try engine.versions("Work.pkg").count
            // The file is held open by a child of its own: when any thread of this process
            // spawns a program (other suites do, all the time), the kernel closes the spawned
            // copies of this process's descriptors at exec, and each such close is a FLUSH of
            // the file, a save point like close.
            let holder = try await offThread { try FileHolder(notes) }
            defer { holder.stop() }
            // Changes every 0.4 s keep the file busy: no save while they go on.
            for step in 0..<4 {
                try await offThread {
                    try holder.send("write ONE\(step)")
                    usleep(400_000)
                }
                let now = try engine.versions("Work.pkg")
                #expect(
                    now.count == versions,
                    "saved while busy (step \(step)): \(now.suffix(now.count - versions))")
            }
            let written = try await offThread { try statOf(notes) }
            if writebackCache {
                // The bytes wait in the page cache until the kernel writes them back: its
                // flusher does within vm.dirty_expire_centisecs (30 s); syncfs does it now,
                // without an fsync, so the save is still the quiet interval's.
                try await offThread {
                    let root = Glibc.open(mount.path, O_RDONLY | O_DIRECTORY)
                    guard root >= 0 else { throw TestFailure("open \(mount.path): \(errno)") }
                    defer { Glibc.close(root) }
                    guard docfs_syncfs(root) == 0 else { throw TestFailure("syncfs: \(errno)") }
                }
            }
            let expected = "ONE3two\nthree\n"
            let took = try await waitUntil(timeout: quiet + 3) {
                try engine.text("Work.pkg", "notes.txt") == expected
            }
            #expect(took != nil, "the quiet interval never saved the open file")
            #expect(try engine.versions("Work.pkg").count == versions + 1)
            // The background save changed neither mtime nor inode (nano and GIO compare them).
            let afterSave = try await offThread { try statOf(notes) }
            #expect(FileTime(afterSave.st_mtim) == FileTime(written.st_mtim))
            #expect(afterSave.st_ino == written.st_ino)
            #expect(afterSave.st_size == expected.utf8.count)
            let record = try #require(try engine.record("Work.pkg", "notes.txt"))
            #expect(FileTime(record.modified) == FileTime(written.st_mtim))
            #expect(UInt64(written.st_ino) == UInt64(record.id.rawValue) + 1)
            // Clean now: close saves nothing more.
            try await offThread { try holder.send("close") }
            #expect(try engine.versions("Work.pkg").count == versions + 1)
        }
    }

    @Test("unmount drains pending saves before the session ends")
    func unmountDrains() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let mount = try TestMount(fixture.store)
        let p = mount.path
        do {
            try await offThread {
                try sys(truncate(p + "/Work.pkg/notes.txt", 3), "truncate")
                try sys(chmod(p + "/Work.pkg/sub/inner.txt", 0o600), "chmod")
                try sys(rename(p + "/Work.pkg/sub/inner.txt", p + "/Work.pkg/inner.txt"), "rename")
                try sys(setxattr(p + "/Flat.txt", "user.pending", "yes", 3, 0), "setxattr")
            }
        } catch {
            mount.close()
            throw error
        }
        // At once, well inside the quiet interval.
        mount.close()
        let engine = try Engine(fixture)
        #expect(try engine.text("Work.pkg", "notes.txt") == "one")
        #expect(try engine.record("Work.pkg", "inner.txt")?.permissions == 0o600)
        #expect(try engine.record("Flat.txt")?.extendedAttributes["user.pending"] == Data("yes".utf8))
    }

    @Test("unmount waits for a save the committer is in the middle of (a file copied in just before)")
    func unmountWaitsForTheCommitter() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let proxy = ProxyStore(fixture.store)
        let mount = try TestMount(proxy)
        let notes = mount.url("Work.pkg/notes.txt")
        // The close hands the save to the committer, whose transaction waits at the gate.
        proxy.holdAllTransactions()
        do {
            try await offThread { try writeText(notes, "copied in just before the unmount\n") }
        } catch {
            proxy.releaseTransactions()
            mount.close()
            throw error
        }
        let held = try await offThread { eventually(timeout: 10) { proxy.waitingTransactions > 0 } }
        #expect(held != nil, "the committer never started the close's save")
        let released = Atomic<Bool>(false)
        let releaser = Thread {
            usleep(300_000)
            released.store(true, ordering: .sequentiallyConsistent)
            proxy.releaseTransactions()
        }
        releaser.start()
        try await offThread { mount.close() }
        // The process of a daemon may end as soon as the session has: the save must be done.
        let waited = released.load(ordering: .sequentiallyConsistent)
        #expect(waited, "the unmount did not wait for the save")
        #expect(try Engine(fixture).text("Work.pkg", "notes.txt") == "copied in just before the unmount\n")
    }

    @Test("the end of the session tries a failing save again, and says what it could not save")
    func unmountRetriesFailedSaves() async throws {
        for givesUp in [false, true] {
            let fixture = try Fixture.small(.memory)
            defer { fixture.remove() }
            let proxy = ProxyStore(fixture.store)
            let reports = Mutex<[[String]]>([])
            let mount = try TestMount(proxy) { options in
                options.fileSystem.finalSaveRetry = givesUp ? .milliseconds(1500) : .seconds(30)
                options.fileSystem.unsavedChanged = { unsaved in reports.withLock { $0.append(unsaved) } }
            }
            // Failing from before the write: the committer's save of the close fails too, so
            // the change is still pending at the end whatever the timing.
            proxy.failSaves.store(true, ordering: .sequentiallyConsistent)
            do {
                try await offThread {
                    try writeText(mount.url("Work.pkg/notes.txt"), "kept through a full disk\n")
                }
            } catch {
                mount.close()
                throw error
            }
            let closing = Thread { mount.close() }
            closing.start()
            let reported = try await offThread {
                eventually(timeout: 10) { !reports.withLock { $0.isEmpty } }
            }
            #expect(reported != nil, "the failing save was never reported")
            let first = reports.withLock { $0.first } ?? []
            #expect(first.count == 1 && first[0].hasPrefix("Work.pkg: "), "\(first)")
            if !givesUp { proxy.failSaves.store(false, ordering: .sequentiallyConsistent) }
            let closed = try await offThread { eventually(timeout: 20) { !mount.mount.isActive } }
            #expect(closed != nil)
            let text = try Engine(fixture).text("Work.pkg", "notes.txt")
            if givesUp {
                #expect(mount.mount.fileSystem.unsavedDocuments.count == 1)
                #expect(text == Fixture.notesText)
            } else {
                #expect(reports.withLock { $0.last } == [], "saved after all")
                #expect(mount.mount.fileSystem.unsavedDocuments.isEmpty)
                #expect(text == "kept through a full disk\n")
            }
        }
    }

    @Test("a failed save comes back from fsync and the next close as an error")
    func saveErrors() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let proxy = ProxyStore(fixture.store)
        let engine = try Engine(fixture)
        try await withMount(proxy) { mount in
            let notes = mount.url("Work.pkg/notes.txt")
            let (fsyncResult, closeResult) = try await offThread { () -> (Int32, Int32) in
                let fd = try openFile(notes, O_WRONLY | O_TRUNC)
                try writeAll(fd, "will not be saved\n")
                proxy.failSaves.store(true, ordering: .sequentiallyConsistent)
                let synced = errnoOf(fsync(fd))
                let closed = errnoOf(close(fd))
                return (synced, closed)
            }
            // Checked while saves still fail: once they work again, the committer may retry the
            // pending change (a failed save's changes stay pending), which is right.
            let stored = try engine.text("Work.pkg", "notes.txt")
            #expect(stored == Fixture.notesText, "\(String(describing: stored))")
            proxy.failSaves.store(false, ordering: .sequentiallyConsistent)
            #expect(fsyncResult != 0, "fsync succeeded although the save failed")
            #expect(closeResult != 0, "close succeeded although the save failed")
            #expect(proxy.failedSaves.load(ordering: .sequentiallyConsistent) > 0)
            // The store works again: the next save succeeds. The committer may have retried the
            // pending change (and failed) between the close and the reset above; a close reports
            // such a failure once, so at most one more close sees it.
            try await offThread {
                do { try writeText(notes, "saved\n") } catch { try writeText(notes, "saved\n") }
            }
            try await expectEventually("the next save") {
                try engine.text("Work.pkg", "notes.txt") == "saved\n"
            }
        }
    }

    // MARK: Attributes

    @Test("chmod, chown and utimensat are saved; inode = node id + 1 across a remount")
    func attributes() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let engine = try Engine(fixture)
        let inode = try await withMount(fixture.store) { mount -> UInt64 in
            let w = mount.url("Work.pkg")
            let inode = try await offThread { () -> UInt64 in
                try sys(chmod(w + "/notes.txt", 0o604), "chmod")
                try sys(chown(w + "/notes.txt", 65534, 65534), "chown")
                try sys(chmod(w + "/sub", 0o711), "chmod dir")
                var times = [
                    timespec(tv_sec: 1_000_000_000, tv_nsec: 5),
                    timespec(tv_sec: 1_200_000_000, tv_nsec: 999_999_999),
                ]
                try sys(utimensat(AT_FDCWD, w + "/sub/inner.txt", &times, 0), "utimensat")
                try writeText(w + "/fresh.txt", "fresh\n")
                let st = try statOf(w + "/notes.txt")
                #expect(st.st_mode == S_IFREG | 0o604 && st.st_uid == 65534 && st.st_gid == 65534)
                return UInt64(try statOf(w + "/fresh.txt").st_ino)
            }
            try await expectEventually("the attributes in the store") {
                let notes = try engine.record("Work.pkg", "notes.txt")
                let inner = try engine.record("Work.pkg", "sub/inner.txt")
                let sub = try engine.record("Work.pkg", "sub")
                return notes?.permissions == 0o604 && notes?.uid == 65534 && notes?.gid == 65534
                    && sub?.permissions == 0o711
                    && inner.map { FileTime($0.modified) }
                        == FileTime(timespec(tv_sec: 1_200_000_000, tv_nsec: 999_999_999))
            }
            #expect(try engine.record("Work.pkg", "sub/inner.txt")?.accessed.seconds == 1_000_000_000)
            let fresh = try #require(try engine.record("Work.pkg", "fresh.txt"))
            #expect(inode == UInt64(fresh.id.rawValue) + 1)
            return inode
        }
        // A new store instance, a new mount: the same inode.
        let reopened = try fixture.reopen()
        try await withMount(reopened) { mount in
            let again = try await offThread { try statOf(mount.url("Work.pkg/fresh.txt")) }
            #expect(UInt64(again.st_ino) == inode)
            #expect(again.st_mode == S_IFREG | 0o644)
            let notes = try await offThread { try statOf(mount.url("Work.pkg/notes.txt")) }
            #expect(notes.st_mode == S_IFREG | 0o604 && notes.st_uid == 65534)
        }
    }

    @Test(
        "after a rename onto a flat document, its inode is still its root node id + 1, before and after a remount"
    )
    func flatDocumentInodeAfterRenameOnto() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let engine = try Engine(fixture)
        let flat = try engine.document("Flat.txt")
        let expected = UInt64(flat.root.rawValue) + 1
        let (before, after) = try await withMount(fixture.store) { mount -> (UInt64, UInt64) in
            // What sed -i, perl -i and GIO do: write a temporary file, rename it onto the document.
            try await offThread {
                let before = UInt64(try statOf(mount.url("Flat.txt")).st_ino)
                try writeText(mount.url("sedAbc123"), "replaced\n")
                try sys(rename(mount.url("sedAbc123"), mount.url("Flat.txt")), "rename")
                return (before, UInt64(try statOf(mount.url("Flat.txt")).st_ino))
            }
        }
        #expect(try engine.document("Flat.txt").id == flat.id)
        #expect(try engine.document("Flat.txt").root == flat.root)
        #expect(try engine.text("Flat.txt") == "replaced\n")
        let remounted = try await withMount(try fixture.reopen()) { mount in
            try await offThread { UInt64(try statOf(mount.url("Flat.txt")).st_ino) }
        }
        #expect(before == expected)
        #expect(after == expected, "inode \(after) after the rename")
        #expect(remounted == expected)
    }

    @Test("files made by another user belong to that user (allow_other, a 0777 package directory)")
    func ownerIsTheCaller() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let engine = try Engine(fixture)
        try await withMount(fixture.store, configure: { $0.allowOther = true }) { mount in
            try await offThread { try sys(chmod(mount.url("Work.pkg"), 0o777), "chmod") }
            let result = try await sh(
                "runuser -u nobody -- sh -c 'umask 022; echo hi > Work.pkg/by-nobody.txt && mkdir Work.pkg/nobody-dir"
                    + " && ln -s by-nobody.txt Work.pkg/nobody-link && id -u && id -g'",
                in: mount.path)
            #expect(result.status == 0, "\(result.error)")
            #expect(result.output == "65534\n65534\n")
            let owners = try await offThread {
                try ["by-nobody.txt", "nobody-dir", "nobody-link"].map { name -> [UInt32] in
                    let st = try lstatOf(mount.url("Work.pkg/" + name))
                    return [st.st_uid, st.st_gid, st.st_mode & 0o777]
                }
            }
            #expect(owners[0] == [65534, 65534, 0o644])
            #expect(owners[1] == [65534, 65534, 0o755])
            #expect(owners[2][0...1] == [65534, 65534])
            try await expectEventually("the owners in the store") {
                let tree = try engine.tree("Work.pkg")
                return ["by-nobody.txt", "nobody-dir", "nobody-link"].allSatisfy {
                    tree[$0]?.uid == 65534 && tree[$0]?.gid == 65534
                }
            }
            #expect(try engine.text("Work.pkg", "by-nobody.txt") == "hi\n")
            // nobody cannot change root's 0640 file (default_permissions).
            let denied = try await sh(
                "runuser -u nobody -- sh -c 'echo x >> Work.pkg/notes.txt'", in: mount.path)
            #expect(denied.status != 0 && denied.error.contains("Permission denied"), "\(denied.error)")
        }
    }

    @Test(
        "set-ID bits are cleared as on a native file system: writes, truncations and O_TRUNC by other users, chown by anyone"
    )
    func setIDBitsCleared() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let engine = try Engine(fixture)
        // Each line: a file made with the mode, then one change. root has CAP_FSETID.
        let script = """
            set -e
            make() { printf 'data\\n' > "$1"; chmod "$2" "$1"; }
            make append 6777; runuser -u nobody -- sh -c 'echo x >> append'
            make nogroupexec 6767; runuser -u nobody -- sh -c 'echo x >> nogroupexec'
            make ingroup 6767; chgrp nogroup ingroup; chmod 6767 ingroup; runuser -u nobody -- sh -c 'echo x >> ingroup'
            make truncate 6777; runuser -u nobody -- truncate -s 1 truncate
            make otrunc 6777; runuser -u nobody -- sh -c ': > otrunc'
            make byroot 6777; echo x >> byroot; truncate -s 1 byroot
            make chown 6777; chown nobody chown
            make chmodonly 6777; chmod 6775 chmodonly
            stat -c '%n %a' append nogroupexec ingroup truncate otrunc byroot chown chmodonly
            """
        let expected =
            "append 777\nnogroupexec 767\ningroup 2767\ntruncate 777\notrunc 777\nbyroot 6777\nchown 777\nchmodonly 6775\n"
        let native = FileManager.default.temporaryDirectory.appendingPathComponent(
            "setid-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: native, withIntermediateDirectories: false)
        defer { try? FileManager.default.removeItem(at: native) }
        _ = try await offThread { try sys(chmod(native.path, 0o777), "chmod") }
        let onNative = try await sh(script, in: native.path)
        #expect(onNative.status == 0, "\(onNative.error)")
        #expect(onNative.output == expected, "the native file system: \(onNative.output)")
        try await withMount(fixture.store, configure: { $0.allowOther = true }) { mount in
            _ = try await offThread { try sys(chmod(mount.url("Work.pkg"), 0o777), "chmod") }
            let onMount = try await sh(script, in: mount.path + "/Work.pkg")
            #expect(onMount.status == 0, "\(onMount.error)")
            #expect(onMount.output == onNative.output)
            try await expectEventually("the cleared modes in the store") {
                let tree = try engine.tree("Work.pkg")
                return tree["append"]?.permissions == 0o777 && tree["nogroupexec"]?.permissions == 0o767
                    && tree["ingroup"]?.permissions == 0o2767
                    && tree["otrunc"]?.permissions == 0o777 && tree["chown"]?.permissions == 0o777
                    && tree["byroot"]?.permissions == 0o6777
            }
        }
    }

    // MARK: statfs, metadata reads

    @Test("statfs of a writable mount reports non-zero sizes and free space")
    func statfs() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        try await withMount(fixture.store) { mount in
            let line = try #require(mountLines(mount.path).first)
            #expect(line.hasPrefix("docfs \(mount.path) fuse.docfs rw,"), "\(line)")
            let st = try await offThread { () -> statvfs in
                var st = statvfs()
                try sys(statvfs(mount.path, &st), "statvfs")
                return st
            }
            #expect(st.f_bsize > 0 && st.f_blocks > 0 && st.f_bfree > 0 && st.f_bavail > 0)
            #expect(st.f_files > 0 && st.f_ffree > 0)
            #expect(st.f_namemax == 255)
            #expect(st.f_flag & UInt(ST_RDONLY) == 0)
        }
    }

    @Test("ls -l, stat and find on a written mount read no content bytes")
    func metadataReadsNoContents() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        try await withMount(fixture.store) { mount in
            let p = mount.path
            try await offThread {
                try writeText(p + "/Work.pkg/written.txt", String(repeating: "x", count: 10_000))
                try writeText(p + "/Flat.txt", "rewritten\n")
                try sys(mkdir(p + "/Made.pkg", 0o755), "mkdir")
                try writeText(p + "/Made.pkg/in.txt", "in\n")
            }
            let before = fixture.store.statistics
            let listed = try await sh(
                "ls -laR >/dev/null && find . -printf '%y %m %s %p\\n' >/dev/null && find . -exec stat {} + >/dev/null"
                    + " && ls -l Work.pkg/written.txt",
                in: p)
            #expect(listed.status == 0, "\(listed.error)")
            #expect(listed.output.contains(" 10000 "), "\(listed.output)")
            let after = fixture.store.statistics
            #expect(
                after.bytesRead == before.bytesRead,
                "metadata reads read \(after.bytesRead - before.bytesRead) bytes")
            #expect(after.chunksRead == before.chunksRead)
        }
    }
}

extension Engine {
    func text(of document: DocumentID, _ path: String, at version: VersionID) throws -> String? {
        guard let record = try tree(of: document, at: version)[path], record.kind == .regularFile else {
            return nil
        }
        let data = try store.readContents(of: record.id, at: version, offset: 0, count: Int(record.size) + 1)
        return String(decoding: data, as: UTF8.self)
    }
}
