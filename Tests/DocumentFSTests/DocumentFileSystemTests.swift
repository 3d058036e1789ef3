import CLinuxSupport
import DocumentEngine
import DocumentFS
import FUSE
import Foundation
import SampleDocuments
import StoreTestSupport
import Synchronization
import SystemPackage
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Mounts real stores and drives them with real syscalls and real tools (ls, find, stat, cat,
/// dd, getfattr, df, touch, fusermount3), from threads and child processes. Serialized: each
/// test holds a mount and its worker threads, and the statistics tests must see only their own
/// reads.
@Suite(.serialized)
struct DocumentFileSystemTests {
    @Test(
        "the root lists documents, packages list wrappers, with real kinds, modes, sizes, times",
        arguments: StoreKind.all)
    func listing(_ kind: StoreKind) async throws {
        let fixture = try await Fixture.make(kind)
        defer { fixture.remove() }
        try await withMount(fixture.store) { mount in
            let mountLine = try #require(mountLines(mount.path).first)
            // A default mount is writable (the read-only one is `readOnlyMount`).
            #expect(mountLine.hasPrefix("docfs \(mount.path) fuse.docfs rw,"), "\(mountLine)")

            let root = try await sh("ls -la", in: mount.path)
            #expect(root.status == 0, "\(root.error)")
            let rootLines = root.output.split(separator: "\n").map(String.init)
            func line(_ name: String) -> String? { rootLines.first { $0.hasSuffix(" " + name) } }
            #expect(line("Things I Own.mystuff")?.hasPrefix("drwxr-xr-x") == true)
            #expect(line("Trip Notes.imagenote")?.hasPrefix("drwxr-xr-x") == true)
            #expect(line("Project.pkg")?.hasPrefix("drwxr-xr-x") == true)
            #expect(line("README.txt")?.hasPrefix("-rw-r--r--") == true)
            #expect(line("Shopping List.txt")?.hasPrefix("-rw-r--r--") == true)
            #expect(line(".")?.hasPrefix("drwxr-xr-x") == true)
            #expect(rootLines.count == 1 + 2 + 5, "\(root.output)")  // total, . and .., 5 documents

            let package = try await sh("ls -la Project.pkg", in: mount.path)
            #expect(package.status == 0, "\(package.error)")
            let names = try await sh("ls -1a Project.pkg", in: mount.path).output
            #expect(names == ".\n..\nbig.bin\nmain-link\nnotes.txt\nsrc\n")
            #expect(package.output.contains("lrwxrwxrwx"))
            #expect(package.output.contains("main-link -> src/main.swift"))

            let p = mount.path
            let notes = try fixture.record("Project.pkg", "notes.txt")
            let big = try fixture.record("Project.pkg", "big.bin")
            try await offThread {
                let st = try lstatOf(p + "/Project.pkg/notes.txt")
                #expect(st.st_mode == S_IFREG | 0o640)
                #expect(st.st_size == Int(notes.size) && notes.size == 35)
                #expect(st.st_nlink == 1)
                #expect(st.st_uid == notes.uid && st.st_gid == notes.gid)
                #expect(st.st_mtim.tv_sec == 1_700_000_000 && st.st_mtim.tv_nsec == 123_456_789)
                #expect(UInt64(st.st_ino) == UInt64(notes.id.rawValue) + 1)
                #expect(try lstatOf(p + "/Project.pkg/big.bin").st_size == Fixture.bigSize)
                #expect(try lstatOf(p + "/Project.pkg/big.bin").st_mode == S_IFREG | 0o600)
                #expect(UInt64(try lstatOf(p + "/Project.pkg/big.bin").st_ino) == UInt64(big.id.rawValue) + 1)
                // Directories: 2 + subdirectories.
                #expect(try lstatOf(p + "/Project.pkg").st_nlink == 3)
                #expect(try lstatOf(p + "/Project.pkg/src").st_nlink == 3)
                #expect(try lstatOf(p + "/Project.pkg/src/deep").st_mode == S_IFDIR | 0o700)
                #expect(try lstatOf(p + "/Project.pkg/src/deep/deeper").st_nlink == 2)
                #expect(try lstatOf(p + "/Project.pkg/src/main.swift").st_mode == S_IFREG | 0o755)
                let link = try lstatOf(p + "/Project.pkg/main-link")
                #expect(link.st_mode & S_IFMT == S_IFLNK && link.st_size == 14)
                // The mount root: inode 1, 2 + three packages.
                let rootStat = try lstatOf(p)
                #expect(rootStat.st_ino == 1 && rootStat.st_nlink == 5)
                var missing = stat()
                #expect(lstat(p + "/Project.pkg/nothing", &missing) == -1 && errno == ENOENT)
                #expect(lstat(p + "/Nothing.txt", &missing) == -1 && errno == ENOENT)
            }
        }
    }

    @Test("ls -lR, find and stat read no wrapper contents", arguments: StoreKind.all)
    func metadataReadsNoContents(_ kind: StoreKind) async throws {
        let fixture = try await Fixture.make(kind)
        defer { fixture.remove() }
        try await withMount(fixture.store) { mount in
            let before = fixture.store.statistics
            let lsR = try await sh("ls -laR", in: mount.path)
            #expect(lsR.status == 0, "\(lsR.error)")
            #expect(lsR.output.contains("./Project.pkg/src/deep/deeper:"))
            #expect(lsR.output.contains("leaf.txt"))
            #expect(lsR.output.contains("image.png"))
            let find = try await sh("find . -printf '%y %m %s %p\\n'", in: mount.path)
            #expect(find.status == 0, "\(find.error)")
            #expect(find.output.contains("f 644 5 ./Project.pkg/src/deep/deeper/leaf.txt"))
            #expect(find.output.contains("l 777 14 ./Project.pkg/main-link"))
            let stat = try await sh("find . -exec stat -c '%i %h %s %F %n' {} +", in: mount.path)
            #expect(stat.status == 0, "\(stat.error)")
            let lines = stat.output.split(separator: "\n")
            #expect(lines.count == find.output.split(separator: "\n").count)
            let after = fixture.store.statistics
            #expect(
                after.bytesRead == before.bytesRead,
                "ls -lR/find/stat read \(after.bytesRead - before.bytesRead) bytes")
            #expect(after.chunksRead == before.chunksRead)
        }
    }

    @Test("every lookup and readdirplus entry is forgotten again when the kernel drops its caches")
    func forgetBalancesLookups() async throws {
        let fixture = try await Fixture.make()
        defer { fixture.remove() }
        try await withMount(fixture.store) { mount in
            let fs = mount.mount.fileSystem
            let listed = try await sh(
                "ls -laR >/dev/null && find . -exec stat {} + >/dev/null", in: mount.path)
            #expect(listed.status == 0, "\(listed.error)")
            #expect(fs.referencedNodeCount > 20)
            // Dentries and inodes go; the kernel forgets every node it was given.
            let dropped = try await offThread { () -> Bool in
                sync()
                guard let file = fopen("/proc/sys/vm/drop_caches", "w") else { return false }
                fputs("2\n", file)
                fclose(file)
                return eventually(timeout: 5) { fs.referencedNodeCount == 1 } != nil
            }
            #expect(dropped, "still referenced: \(fs.referencedNodeCount)")
        }
    }

    @Test(
        "inode numbers are stable across an unmount and a remount with a new store instance",
        arguments: StoreKind.all)
    func stableInodes(_ kind: StoreKind) async throws {
        let fixture = try await Fixture.make(kind)
        defer { fixture.remove() }
        let script = "find . -exec stat -c '%i %n' {} + | sort -k2"
        let first = try await withMount(fixture.store) { mount in
            try await sh(script, in: mount.path).output
        }
        let reopened = try fixture.reopen()
        let second = try await withMount(reopened) { mount in
            try await sh(script, in: mount.path).output
        }
        #expect(first.split(separator: "\n").count > 20)
        #expect(first == second)
        #expect(first.contains("\n1 .\n") || first.hasPrefix("1 .\n"))
        let inodes = first.split(separator: "\n").map { $0.split(separator: " ")[0] }
        #expect(Set(inodes).count == inodes.count, "inode numbers are unique")
    }

    @Test(
        "Whole-page writes into a stored file take in none of its chunks; the save keeps every byte",
        arguments: StoreKind.all)
    func pageWrites(_ kind: StoreKind) async throws {
        let fixture = try await Fixture.make(kind)
        defer { fixture.remove() }
        let store = fixture.store
        let big = try fixture.record("Project.pkg", "big.bin")
        var expected = Fixture.bigContents()
        try await withMount(store) { mount in
            let fd = open(mount.path + "/Project.pkg/big.bin", O_RDWR)
            try #require(fd >= 0)
            defer { close(fd) }
            store.purgeCache()
            let before = store.statistics
            // More writes than a layer keeps byte ranges for, at random whole pages.
            var random = SplitMix64(seed: 16)
            for round in 0..<1500 {
                let page = Int.random(in: 0..<Fixture.bigSize / 4096, using: &random)
                let bytes = sampleBytes(4096, seed: UInt64(round))
                let written = bytes.withUnsafeBytes { pwrite(fd, $0.baseAddress, 4096, off_t(page * 4096)) }
                try #require(written == 4096)
                expected.replaceSubrange(page * 4096..<(page + 1) * 4096, with: bytes)
            }
            // The kernel's writeback sends the pages now, without a save.
            try #require(sync_file_range(fd, 0, 0, 7) == 0)
            // Each page is whole: nothing old is read to go with it (a chunk a page was 256 KiB).
            #expect(store.statistics.bytesRead == before.bytesRead)
            // A write inside a page takes in that page alone, once the kernel has read it.
            let tail = sampleBytes(10, seed: 99)
            let inside = tail.withUnsafeBytes { pwrite(fd, $0.baseAddress, 10, 600_005) }
            try #require(inside == 10)
            expected.replaceSubrange(600_005..<600_015, with: tail)
            try #require(fsync(fd) == 0)

            // The fsync logged the changes; the committer saves them.
            let final = expected
            _ = try await expectEventually("the fsync's save committed") {
                try fixture.reopen().readContents(of: big.id, at: nil, offset: 0, count: Fixture.bigSize) == final
            }
            let other = try fixture.reopen()
            #expect(try other.checkIntegrity().isClean)
            #expect(try await shBytes("cat Project.pkg/big.bin", in: mount.path) == expected)
        }
    }

    @Test(
        "A truncation inside a written file keeps the pages below it and zeroes the rest",
        arguments: StoreKind.all)
    func truncateWrittenPages(_ kind: StoreKind) async throws {
        let fixture = try await Fixture.make(kind)
        defer { fixture.remove() }
        try await withMount(fixture.store) { mount in
            let fd = open(mount.path + "/Project.pkg/cut.bin", O_RDWR | O_CREAT, 0o644)
            try #require(fd >= 0)
            defer { close(fd) }
            let written = sampleBytes(200 * 4096, seed: 21)
            try #require(
                written.withUnsafeBytes { pwrite(fd, $0.baseAddress, written.count, 0) } == written.count)
            // The pages reach the mount before the truncation, not after it.
            try #require(sync_file_range(fd, 0, 0, 7) == 0)
            // Page 100 is cut in its middle; pages 101 on go, most of a 64-page word among them.
            let cut = 100 * 4096 + 123
            try #require(ftruncate(fd, off_t(cut)) == 0)
            try #require(ftruncate(fd, off_t(written.count)) == 0)
            let expected = written.prefix(cut) + Data(count: written.count - cut)
            try #require(fsync(fd) == 0)
            #expect(try await shBytes("cat Project.pkg/cut.bin", in: mount.path) == expected)
            _ = try await expectEventually("the fsync's save committed") {
                let other = try fixture.reopen()
                let document = try #require(try other.document(named: "Project.pkg"))
                guard let record = try other.nodes(of: document.id).first(where: { $0.name == "cut.bin" }) else {
                    return false
                }
                return try other.readContents(of: record.id, at: nil, offset: 0, count: written.count) == expected
            }
        }
    }

    @Test(
        "cat returns the engine's bytes; a ranged dd reads only the chunk that covers it",
        arguments: StoreKind.all)
    func reads(_ kind: StoreKind) async throws {
        let fixture = try await Fixture.make(kind)
        defer { fixture.remove() }
        let store = fixture.store
        let big = try fixture.record("Project.pkg", "big.bin")
        let expected = Fixture.bigContents()
        try await withMount(store) { mount in
            // Cold: the store's chunk cache is empty and the kernel has never seen the file.
            store.purgeCache()
            let before = store.statistics
            // Block 256 of 4 KiB is the start of chunk 4 (256 KiB chunks); kernel readahead
            // (at most 128 KiB) stays inside that chunk.
            let block = try await shBytes(
                "dd if=Project.pkg/big.bin bs=4096 skip=256 count=1 2>/dev/null", in: mount.path)
            let after = store.statistics
            #expect(block == expected.subdata(in: 1_048_576..<1_048_576 + 4096))
            // The one or two chunks (content-defined, at most a chunk size each) that cover it.
            #expect(after.chunksRead - before.chunksRead <= 2)
            #expect(after.bytesRead - before.bytesRead <= 2 * Int64(Fixture.chunkSize))

            let whole = try await shBytes("cat Project.pkg/big.bin", in: mount.path)
            #expect(whole == expected)
            let engine = try store.readContents(of: big.id, at: nil, offset: 0, count: Fixture.bigSize)
            #expect(whole == engine)
            // Unchanged since the last open: keep_cache lets the kernel serve it from its cache.
            store.purgeCache()
            let cachedBefore = store.statistics
            #expect(try await shBytes("cat Project.pkg/big.bin", in: mount.path) == expected)
            #expect(store.statistics.chunksRead == cachedBefore.chunksRead)

            for (document, path) in [
                ("README.txt", [String]()), ("Shopping List.txt", []), ("Project.pkg", ["notes.txt"]),
                ("Trip Notes.imagenote", []),
            ] {
                let info = try #require(try store.document(named: document))
                let records = try store.nodes(of: info.id)
                let files: [(String, NodeRecord)]
                if path.isEmpty && info.kind == .package {
                    // Every regular file directly in the package.
                    files = records.filter { $0.parent == info.root && $0.kind == .regularFile }.map {
                        ("\(document)/\($0.name)", $0)
                    }
                } else if path.isEmpty {
                    files = [(document, try #require(records.first { $0.id == info.root }))]
                } else {
                    files = [
                        ("\(document)/\(path.joined(separator: "/"))", try fixture.record(document, path[0]))
                    ]
                }
                #expect(!files.isEmpty)
                for (relative, record) in files {
                    let bytes = try await shBytes("cat '\(relative)'", in: mount.path)
                    let engine = try store.readContents(
                        of: record.id, at: nil, offset: 0, count: Int(record.size))
                    #expect(bytes == engine, "\(relative)")
                    #expect(bytes.count == Int(record.size))
                }
            }
            let readme = try await sh("cat README.txt", in: mount.path)
            #expect(readme.output.hasPrefix("This store was made by `docfs create --demo`."))
        }
    }

    @Test(
        "readlink shows the target; getfattr shows the user. xattrs; others are absent",
        arguments: StoreKind.all)
    func linksAndXattrs(_ kind: StoreKind) async throws {
        let fixture = try await Fixture.make(kind)
        defer { fixture.remove() }
        try await withMount(fixture.store) { mount in
            let p = mount.path
            let target = try await sh("readlink Project.pkg/main-link", in: p)
            #expect(target.output == "src/main.swift\n")
            let through = try await sh("cat Project.pkg/main-link", in: p)
            #expect(through.output == "print(\"hello\")\n")
            let dump = try await sh("getfattr -d Project.pkg/notes.txt", in: p)
            #expect(dump.status == 0, "\(dump.error)")
            #expect(dump.output.contains("user.color=\"blue\""))
            #expect(dump.output.contains("user.tag=\"draft\""))
            let one = try await sh("getfattr --only-values -n user.color Project.pkg/notes.txt", in: p)
            #expect(one.output == "blue")
            let none = try await sh("getfattr -n user.nothing Project.pkg/notes.txt", in: p)
            #expect(none.status != 0 && none.error.contains("No such attribute"))
            // Namespaces other than user. are not supported, for reading as for writing.
            let security = try await sh("getfattr -n security.capability Project.pkg/notes.txt", in: p)
            #expect(security.status != 0 && security.error.contains("Operation not supported"))
            let empty = try await sh("getfattr -d Project.pkg/src .", in: p)
            #expect(empty.status == 0 && empty.output.isEmpty)
        }
    }

    @Test("df shows non-zero sizes")
    func statfs() async throws {
        let fixture = try await Fixture.make()
        defer { fixture.remove() }
        try await withMount(fixture.store) { mount in
            let p = mount.path
            let df = try await sh("df -k -P \(p) | tail -1", in: "/")
            let fields = df.output.split(separator: " ", omittingEmptySubsequences: true)
            #expect(fields.first == "docfs")
            #expect(
                fields.count >= 6 && (Int(fields[1]) ?? 0) > 0 && (Int(fields[3]) ?? 0) > 0, "\(df.output)")
            try await offThread {
                var st = statvfs()
                #expect(statvfs(p, &st) == 0)
                #expect(st.f_bsize == 4096 && st.f_blocks > 0 && st.f_bfree > 0 && st.f_files > 0)
                #expect(st.f_namemax == 255)
            }
        }
    }

    @Test("a read-only mount (options.readOnly) refuses every change with EROFS")
    func readOnlyMount() async throws {
        let fixture = try await Fixture.make()
        defer { fixture.remove() }
        let versions = try fixture.store.documents().map { try fixture.store.versions(of: $0.id).count }
        try await withMount(fixture.store, configure: { $0.readOnly = true }) { mount in
            let p = mount.path
            let mountLine = try #require(mountLines(p).first)
            #expect(mountLine.hasPrefix("docfs \(p) fuse.docfs ro,"), "\(mountLine)")
            let touch = try await sh("touch new.txt", in: p)
            #expect(touch.status != 0 && touch.error.contains("Read-only file system"))
            let overwrite = try await sh("touch Project.pkg/notes.txt", in: p)
            #expect(overwrite.status != 0 && overwrite.error.contains("Read-only file system"))
            let setfattr = try await sh("setfattr -n user.x -v 1 Project.pkg/notes.txt", in: p)
            #expect(setfattr.status != 0 && setfattr.error.contains("Read-only file system"))
            let errors = try await offThread { () -> [Int32] in
                var result: [Int32] = []
                let fd = open(p + "/README.txt", O_WRONLY | O_CLOEXEC)
                result.append(fd < 0 ? errno : 0)
                if fd >= 0 { close(fd) }
                result.append(mkdir(p + "/New.pkg", 0o755) < 0 ? errno : 0)
                result.append(unlink(p + "/README.txt") < 0 ? errno : 0)
                result.append(rename(p + "/README.txt", p + "/READ.txt") < 0 ? errno : 0)
                result.append(mkdir(p + "/Project.pkg/dir", 0o755) < 0 ? errno : 0)
                result.append(unlink(p + "/Project.pkg/notes.txt") < 0 ? errno : 0)
                result.append(symlink("x", p + "/Project.pkg/l") < 0 ? errno : 0)
                result.append(truncate(p + "/Project.pkg/notes.txt", 0) < 0 ? errno : 0)
                result.append(chmod(p + "/Project.pkg/notes.txt", 0o600) < 0 ? errno : 0)
                return result
            }
            #expect(errors == Array(repeating: EROFS, count: 9))
            // Reads still work.
            #expect(try await sh("cat Project.pkg/src/main.swift", in: p).output == "print(\"hello\")\n")
        }
        #expect(try fixture.store.documents().map { try fixture.store.versions(of: $0.id).count } == versions)
    }

    @Test("a default mount is writable: a created file becomes a flat document", arguments: StoreKind.all)
    func defaultMountIsWritable(_ kind: StoreKind) async throws {
        let fixture = try await Fixture.make(kind)
        defer { fixture.remove() }
        try await withMount(fixture.store) { mount in
            let made = try await sh(
                "echo written > new.txt && echo more >> Project.pkg/notes.txt", in: mount.path)
            #expect(made.status == 0, "\(made.error)")
            let other = try fixture.reopen()
            let info = try #require(try other.document(named: "new.txt"))
            #expect(info.kind == .flat)
            let notes = try fixture.record("Project.pkg", "notes.txt")
            // Closes are committed by the group committer, moments after they return.
            try await expectEventually("both saves in the store") {
                let record = try other.node(info.root, at: nil)
                let contents = try other.readContents(of: notes.id, at: nil, offset: 0, count: 1000)
                return try record.map { try other.readContents(of: $0.id, at: nil, offset: 0, count: 100) }
                    == Data("written\n".utf8)
                    && String(decoding: contents, as: UTF8.self)
                        == "Notes with ünïcode.\nSecond line.\nmore\n"
            }
        }
    }

    @Test(
        "another connection's save, create and delete show up in the mount through the daemon's invalidation",
        arguments: StoreKind.all)
    func otherWriters(_ kind: StoreKind) async throws {
        let fixture = try await Fixture.make(kind)
        defer { fixture.remove() }
        try await withMount(fixture.store, configure: kernelCachesForAMinute) { mount in
            let p = mount.path
            #expect(try await sh("cat README.txt", in: p).output.hasPrefix("This store"))
            #expect(try await sh("cat Project.pkg/src/main.swift", in: p).output == "print(\"hello\")\n")
            _ = try await sh("ls -lR", in: p)

            // As another process would: its own connection to the same file.
            let engine = try Engine(fixture)
            let other = engine.store
            let text = "Changed by another process, and longer than before.\nSecond line.\n"
            try engine.replaceText("README.txt", "", with: text)

            // A wrapper inside a package, and a new one beside it.
            let project = try #require(try other.document(named: "Project.pkg"))
            let main = try #require(try other.nodes(of: project.id).first { $0.name == "main.swift" })
            let added = try other.makeNodeIDs(count: 1)[0]
            var packageChanges = DocumentChanges(document: project.id, base: project.currentVersion)
            packageChanges.nodes = [
                main,
                NodeRecord(
                    id: added, document: project.id, parent: main.parent, name: "added.swift",
                    kind: .regularFile, permissions: 0o644),
            ]
            packageChanges.contents = [
                main.id: .replace(DataContentsSource(Data("print(\"changed\")\n".utf8))),
                added: .replace(DataContentsSource(Data("// new\n".utf8))),
            ]
            _ = try other.save(packageChanges)
            _ = try other.createDocument(
                named: "New Note.txt", kind: .flat, type: nil, permissions: nil, origin: "other process")
            let shopping = try #require(try other.document(named: "Shopping List.txt"))
            try other.deleteDocument(shopping.id, origin: "other process")
            let trip = try #require(try other.document(named: "Trip Notes.imagenote"))
            _ = try other.renameDocument(trip.id, to: "Trip Notes (renamed).imagenote")

            // First a stat, before any open: the kernel holds the old attributes for a minute, so
            // only the observer's invalidation can show the new size.
            let size = text.utf8.count
            let attributes = try await offThread {
                eventually(timeout: 10) { try lstatOf(p + "/README.txt").st_size == size }
            }
            #expect(attributes != nil, "the new size never showed up")
            let waited = try await offThread { () -> [Double?] in
                [
                    eventually(timeout: 10) { try readText(p + "/README.txt") == text },
                    eventually(timeout: 10) {
                        try readText(p + "/Project.pkg/src/main.swift") == "print(\"changed\")\n"
                    },
                    eventually(timeout: 10) {
                        try FileManager.default.contentsOfDirectory(atPath: p + "/Project.pkg/src").contains(
                            "added.swift")
                    },
                    eventually(timeout: 10) {
                        let names = try FileManager.default.contentsOfDirectory(atPath: p)
                        return names.contains("New Note.txt") && !names.contains("Shopping List.txt")
                            && names.contains("Trip Notes (renamed).imagenote")
                            && !names.contains("Trip Notes.imagenote")
                    },
                ]
            }
            for (index, seconds) in waited.enumerated() {
                #expect(seconds != nil, "change \(index) never showed up")
            }
            let st = try lstatOf(p + "/README.txt")
            #expect(st.st_size == text.utf8.count)
            #expect(try await sh("cat 'Shopping List.txt'", in: p).status != 0)
            // The kernel's cached names went with the listing: the old name is gone at once.
            #expect(try await sh("ls 'Trip Notes.imagenote'", in: p).status != 0)
            let renamed = try await sh("ls 'Trip Notes (renamed).imagenote'", in: p)
            #expect(renamed.status == 0 && renamed.output.contains("Text.txt"), "\(renamed.output)")
        }
    }

    @Test(
        "a handle reads the version it was opened at; a new open sees the new one", arguments: StoreKind.all)
    func handlesKeepTheirVersion(_ kind: StoreKind) async throws {
        let fixture = try await Fixture.make(kind)
        defer { fixture.remove() }
        try await withMount(fixture.store) { mount in
            let p = mount.path
            let fd = try await offThread { () -> Int32 in
                let fd = open(p + "/Shopping List.txt", O_RDONLY | O_CLOEXEC)
                guard fd >= 0 else { throw Errno(rawValue: errno) }
                return fd
            }
            defer { close(fd) }
            // Same length, so the kernel's size does not cut the old handle's read short.
            let other = try fixture.reopen()
            let info = try #require(try other.document(named: "Shopping List.txt"))
            var changes = DocumentChanges(document: info.id, base: info.currentVersion)
            changes.contents = [info.root: .replace(DataContentsSource(Data("MILK\nEGGS\nBREAD\n".utf8)))]
            _ = try other.save(changes)
            // The observer drops the kernel's cached pages; the old handle's next read reaches
            // the file system, which reads the version the handle was opened at. (The page
            // cache is per inode, so this holds until a new open fills it with the new bytes.)
            _ = try await offThread { usleep(500_000) }
            let old = try await offThread { () -> String in
                var buffer = [UInt8](repeating: 0, count: 64)
                let n = pread(fd, &buffer, 64, 0)
                guard n >= 0 else { throw Errno(rawValue: errno) }
                return String(decoding: buffer[..<n], as: UTF8.self)
            }
            #expect(old == "milk\neggs\nbread\n")
            let fresh = try await offThread { () -> Double? in
                eventually(timeout: 3) { try readText(p + "/Shopping List.txt") == "MILK\nEGGS\nBREAD\n" }
            }
            #expect(fresh != nil)
        }
    }

    @Test("a foreground session serves until fusermount3 -u, with the options asked for")
    func foregroundSession() async throws {
        let fixture = try await Fixture.make()
        defer { fixture.remove() }
        let path = try temporaryDirectory("docfs-mnt")
        defer { rmdir(path) }
        var options = DocumentFSMount.Options()
        options.fsName = "docfs-test"
        options.readOnly = true
        options.drainTimeout = .seconds(2)
        let mount = try DocumentFSMount(store: fixture.store, at: path, options: options)
        // run() blocks until the mount goes away, so it gets a thread of its own.
        let finished = Atomic<Int>(0)
        Thread.detachNewThread {
            let ok = (try? mount.run()) != nil
            finished.store(ok ? 1 : 2, ordering: .sequentiallyConsistent)
        }
        defer {
            if isMounted(path) { _ = try? runTimed("/bin/fusermount3", ["-u", "-z", path], seconds: 20) }
        }
        let mounted = try await offThread { eventually(timeout: 5, { isMounted(path) }) != nil }
        guard mounted else { throw TestFailure("not mounted") }
        let watchdog = MountWatchdog(path: path, deadline: defaultMountDeadline)
        defer { if let fired = watchdog.cancel() { Issue.record(Comment(rawValue: fired)) } }
        let listed = try await offThread { () -> String in
            try FileManager.default.contentsOfDirectory(atPath: path).sorted().joined(separator: ",")
        }
        #expect(listed.contains("README.txt"))
        let line = try #require(mountLines(path).first)
        #expect(line.hasPrefix("docfs-test \(path) fuse.docfs ro,"), "\(line)")
        #expect(line.contains("default_permissions"))
        let unmounted = try await offThread { try runTimed("/bin/fusermount3", ["-u", path], seconds: 20) }
        #expect(unmounted.status == 0, "\(unmounted.error)")
        let ended = try await offThread {
            eventually(timeout: 5) { finished.load(ordering: .sequentiallyConsistent) != 0 }
        }
        #expect(ended != nil)
        #expect(finished.load(ordering: .sequentiallyConsistent) == 1)
        #expect(!isMounted(path))
    }

    @Test("after unmount nothing keeps the file system (and so the store's files) alive")
    func unmountReleasesTheFileSystem() async throws {
        let fixture = try await Fixture.make()
        defer { fixture.remove() }
        let box = WeakBox()
        try await withMount(fixture.store) { mount in
            box.value = mount.mount.fileSystem
            let listed = try await sh("ls -lR", in: mount.path)
            #expect(listed.status == 0)
        }
        // The observer's thread lets go within one poll interval.
        let released = try await offThread { eventually(timeout: 3) { box.value == nil } }
        #expect(released != nil)
    }

    @Test("fusermount3 -u with a file open ends the session cleanly")
    func unmountWithOpenFile() async throws {
        let fixture = try await Fixture.make()
        defer { fixture.remove() }
        let mount = try TestMount(fixture.store)
        defer { mount.close() }
        let p = mount.path
        let fd = try await offThread { () -> Int32 in
            // Close-on-exec: a child another suite spawns meanwhile must not inherit it (its
            // close would send FLUSH to a session that is ending).
            let fd = open(p + "/Project.pkg/notes.txt", O_RDONLY | O_CLOEXEC)
            guard fd >= 0 else { throw Errno(rawValue: errno) }
            var buffer = [UInt8](repeating: 0, count: 5)
            #expect(read(fd, &buffer, 5) == 5)
            return fd
        }
        // A busy mount: a plain unmount is refused, a lazy one detaches it at once.
        let busy = try await offThread { try runTimed("/bin/fusermount3", ["-u", p], seconds: 20) }
        if busy.status != 0 {
            #expect(busy.error.contains("busy"), "\(busy.error)")
            #expect(isMounted(p))
            let lazy = try await offThread { try runTimed("/bin/fusermount3", ["-u", "-z", p], seconds: 20) }
            #expect(lazy.status == 0, "\(lazy.error)")
        }
        #expect(!isMounted(p))
        // The open file still reads until it is closed; then the session ends by itself.
        try await offThread {
            var buffer = [UInt8](repeating: 0, count: 5)
            #expect(read(fd, &buffer, 5) == 5)
            #expect(close(fd) == 0)
        }
        let ended = try await offThread { () -> Bool in
            eventually(timeout: 5) { !mount.mount.isActive } != nil
        }
        #expect(ended)
        let result = try await offThread { mount.mount.waitUntilFinished() }
        #expect((try? result.get()) != nil, "\(result)")
    }
}

/// The whole file as UTF-8 (throws on errors).
func readText(_ path: String) throws -> String {
    String(decoding: try Data(contentsOf: URL(fileURLWithPath: path)), as: UTF8.self)
}

/// A weak reference that tests can hand between threads.
final class WeakBox: @unchecked Sendable {
    weak var value: AnyObject?
}
