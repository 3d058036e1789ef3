import DocumentEngine
import DocumentFS
import FUSE
import Foundation
import SQLiteStore
import StoreTestSupport
import SystemPackage
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// The write path, checked through a second store connection (as an app would see it).
@Suite(.serialized)
struct WritePathTests {
    /// Contents of a wrapper by path, read through another connection to the store file.
    func stored(_ fixture: Fixture, _ document: String, _ path: String...) throws -> String? {
        try stored(in: fixture.reopen(), document, path)
    }

    /// Contents of a wrapper by path in `other`.
    func stored(in other: any DocumentStore, _ document: String, _ path: [String]) throws -> String? {
        guard let info = try other.document(named: document) else { return nil }
        let records = try other.nodes(of: info.id)
        var current = info.root
        for name in path {
            guard let next = records.first(where: { $0.parent == current && $0.name == name }) else {
                return nil
            }
            current = next.id
        }
        guard let record = records.first(where: { $0.id == current }) else { return nil }
        let data = try other.readContents(of: current, at: nil, offset: 0, count: Int(record.size))
        return String(decoding: data, as: UTF8.self)
    }

    /// Holds the mount's background saves and the store's background checkpoints, so that the
    /// store's files hold only what requests made durable themselves; returns the SQLite store,
    /// if the fixture's is one (its checkpoints are the caller's to resume).
    func holdBackgroundWork(_ fs: DocumentFileSystem, _ fixture: Fixture) -> SQLiteStore? {
        fs.holdBackgroundSaves(true)
        let sqlite = fixture.store as? SQLiteStore
        sqlite?.suspendBackgroundCheckpoints()
        return sqlite
    }

    func names(_ fixture: Fixture, _ document: String) throws -> Set<String> {
        let other = try fixture.reopen()
        guard let info = try other.document(named: document) else { return [] }
        return Set(try other.nodes(of: info.id).filter { $0.id != info.root }.map(\.name))
    }

    @Test(
        "after an fsync, the file's next writes go into the layer its save wrote, with no chunk read from the store or copied",
        arguments: StoreKind.all)
    func savedLayerStaysAsACache(_ kind: StoreKind) async throws {
        let fixture = try await Fixture.make(kind)
        let store = fixture.store
        try await withMount(store) { mount in
            let fs = mount.mount.fileSystem
            let path = mount.url("Project.pkg/kept.bin")
            let first = sampleBytes(300 * 1024, seed: 41)
            let fd = open(path, O_CREAT | O_RDWR, 0o644)
            #expect(fd >= 0)
            #expect(first.withUnsafeBytes { pwrite(fd, $0.baseAddress, first.count, 0) } == first.count)
            #expect(fsync(fd) == 0)

            // Partial writes into both saved chunks need their other bytes: none come from the
            // store, and none are copied (a new layer over the saved one copied each chunk).
            store.purgeCache()
            let before = store.statistics
            let copiedBefore = fs.chunksCopiedBetweenLayers
            let patch = [UInt8](repeating: 0x5A, count: 100)
            #expect(patch.withUnsafeBytes { pwrite(fd, $0.baseAddress, 100, 10) } == 100)
            #expect(patch.withUnsafeBytes { pwrite(fd, $0.baseAddress, 100, 290 * 1024) } == 100)
            var expected = first
            expected.replaceSubrange(10..<110, with: patch)
            expected.replaceSubrange(290 * 1024..<290 * 1024 + 100, with: patch)
            #expect(fsync(fd) == 0)
            #expect(store.statistics.chunksRead == before.chunksRead, "a chunk was read from the store")
            #expect(fs.chunksCopiedBetweenLayers == copiedBefore, "a chunk was copied into a new layer")
            // And again: the layer the second save wrote takes the third change.
            #expect(patch.withUnsafeBytes { pwrite(fd, $0.baseAddress, 50, 200) } == 50)
            expected.replaceSubrange(200..<250, with: patch[0..<50])
            #expect(fsync(fd) == 0)
            #expect(fs.chunksCopiedBetweenLayers == copiedBefore, "a chunk was copied into a new layer")
            close(fd)
            let final = expected
            _ = try await expectEventually("the last fsync's save committed") {
                let record = try fixture.record("Project.pkg", "kept.bin")
                return try fixture.reopen().readContents(
                    of: record.id, at: nil, offset: 0, count: final.count)
                    == final
            }

            #expect(try Data(contentsOf: URL(fileURLWithPath: path)) == expected)
        }
    }

    @Test(
        "small files' bytes wait in memory, and it is given back once they are saved and closed; a file kept open keeps its saved bytes as a cache",
        arguments: StoreKind.all)
    func smallFilesMemoryIsGivenBack(_ kind: StoreKind) async throws {
        let fixture = try await Fixture.make(kind)
        try await withMount(fixture.store) { mount in
            let fs = mount.mount.fileSystem
            let bytes = sampleBytes(4096, seed: 45)
            for i in 0..<50 {
                try bytes.write(to: URL(fileURLWithPath: mount.url("Project.pkg/small-\(i).bin")))
            }
            #expect(
                eventually(timeout: 10) { fs.memoryForSmallFilesInUse == 0 } != nil,
                "still \(fs.memoryForSmallFilesInUse) bytes in memory")
            // Many, quickly, as an unpacker makes them: their saves are grouped and often end
            // after the file's last close, and give the memory back then.
            for i in 0..<2000 {
                let fd = open(mount.url("Project.pkg/many-\(i).bin"), O_CREAT | O_WRONLY | O_EXCL, 0o644)
                #expect(fd >= 0)
                #expect(bytes.withUnsafeBytes { write(fd, $0.baseAddress, 4096) } == 4096)
                close(fd)
            }
            #expect(
                eventually(timeout: 10) { fs.memoryForSmallFilesInUse == 0 } != nil,
                "still \(fs.memoryForSmallFilesInUse) bytes in memory")
            let fd = open(mount.url("Project.pkg/open.bin"), O_CREAT | O_RDWR, 0o644)
            #expect(fd >= 0)
            #expect(bytes.withUnsafeBytes { pwrite(fd, $0.baseAddress, 4096, 0) } == 4096)
            // With the writeback cache the bytes reach the daemon when the kernel writes its
            // pages back, at the latest at the fsync.
            #expect(fsync(fd) == 0)
            #expect(fs.memoryForSmallFilesInUse == 4096, "the saved bytes of an open file stay as its cache")
            close(fd)
            #expect(eventually(timeout: 10) { fs.memoryForSmallFilesInUse == 0 } != nil)
            for i in [0, 49] {
                #expect(
                    try Data(contentsOf: URL(fileURLWithPath: mount.url("Project.pkg/small-\(i).bin")))
                        == bytes)
            }
        }
    }

    @Test(
        "a file written and closed in a package is saved; mkdir, mv and rm are saved by the quiet interval",
        arguments: StoreKind.all)
    func packageEdits(_ kind: StoreKind) async throws {
        let fixture = try await Fixture.make(kind)
        defer { fixture.remove() }
        try await withMount(fixture.store) { mount in
            let p = mount.path + "/Project.pkg"
            let result = try await sh(
                "printf 'hello\\n' > new.txt && mkdir dir && mv new.txt dir/ && printf 'more\\n' >> dir/new.txt && rm notes.txt && cat dir/new.txt",
                in: p)
            #expect(result.status == 0, "\(result.error)")
            #expect(result.output == "hello\nmore\n")
            let saved = try await offThread {
                eventually(timeout: 5) {
                    try self.stored(fixture, "Project.pkg", "dir", "new.txt") == "hello\nmore\n"
                }
            }
            #expect(saved != nil)
            let gone = try await offThread {
                eventually(timeout: 5) { try !self.names(fixture, "Project.pkg").contains("notes.txt") }
            }
            #expect(gone != nil)
        }
    }

    @Test(
        "sed -i on a wrapper and on a flat document saves new versions and leaves no temp file",
        arguments: StoreKind.all)
    func sedInPlace(_ kind: StoreKind) async throws {
        let fixture = try await Fixture.make(kind)
        defer { fixture.remove() }
        let readmeID = try #require(try fixture.store.document(named: "README.txt")).id
        try await withMount(fixture.store) { mount in
            let r1 = try await sh("sed -i 's/hello/bonjour/' Project.pkg/src/main.swift", in: mount.path)
            #expect(r1.status == 0, "\(r1.error)")
            // The rename that ends sed's save is a save point; the committer commits it.
            _ = try await expectEventually("main.swift saved") {
                try self.stored(fixture, "Project.pkg", "src", "main.swift") == "print(\"bonjour\")\n"
            }
            let r2 = try await sh(
                "sed -i '1s/.*/FIRST/' README.txt && head -1 README.txt && ls -a", in: mount.path)
            #expect(r2.status == 0, "\(r2.error)")
            #expect(r2.output.hasPrefix("FIRST\n"))
            #expect(!r2.output.contains("sed"))
            _ = try await expectEventually("README.txt saved") {
                try self.stored(fixture, "README.txt")?.hasPrefix("FIRST\n") == true
            }
            #expect(try fixture.reopen().document(named: "README.txt")?.id == readmeID)
            #expect(try names(fixture, "Project.pkg").allSatisfy { !$0.hasPrefix("sed") })
        }
    }

    @Test(
        "mkdir and create at the root make package and flat documents; rm -r deletes one",
        arguments: StoreKind.all)
    func rootDocuments(_ kind: StoreKind) async throws {
        let fixture = try await Fixture.make(kind)
        defer { fixture.remove() }
        try await withMount(fixture.store) { mount in
            let r = try await sh(
                "mkdir New.pkg && echo inside > New.pkg/a.txt && echo flat > Flat.txt && rm -r Project.pkg && ls",
                in: mount.path)
            #expect(r.status == 0, "\(r.error)")
            #expect(try stored(fixture, "Flat.txt") == "flat\n")
            #expect(try stored(fixture, "New.pkg", "a.txt") == "inside\n")
            let other = try fixture.reopen()
            #expect(try other.document(named: "Project.pkg") == nil)
            #expect(try other.deletedDocuments().contains { $0.name == "Project.pkg" })
        }
    }

    @Test(
        "vim saves a wrapper (rename-save and backupcopy=yes) without leaving swap or backup wrappers",
        arguments: StoreKind.all)
    func vim(_ kind: StoreKind) async throws {
        let fixture = try await Fixture.make(kind)
        defer { fixture.remove() }
        try await withMount(fixture.store) { mount in
            let p = mount.path + "/Project.pkg"
            let r = try await sh(
                "HOME=/tmp timeout -k 5 30 vim -N -u NONE -i NONE -es -c 'set swapfile directory=. backup writebackup' -c '%s/Notes/Vim notes/' -c 'wq' notes.txt",
                in: p)
            #expect(r.status == 0, "\(r.error)")
            _ = try await expectEventually("vim's save committed") {
                try stored(fixture, "Project.pkg", "notes.txt")?.hasPrefix("Vim notes") == true
            }
            let r2 = try await sh(
                "HOME=/tmp timeout -k 5 30 vim -N -u NONE -i NONE -es -c 'set backupcopy=yes swapfile directory=.' -c '%s/Vim/Copy/' -c 'wq' notes.txt",
                in: p)
            #expect(r2.status == 0, "\(r2.error)")
            _ = try await expectEventually("vim's second save committed") {
                try stored(fixture, "Project.pkg", "notes.txt")?.hasPrefix("Copy notes") == true
            }
            let all = try names(fixture, "Project.pkg")
            #expect(!all.contains { $0.hasSuffix(".swp") || $0.hasSuffix("~") || $0 == "4913" })
        }
    }

    @Test("a child that inherited a dirty descriptor does not save it when it execs; the writer's close does")
    func flushFromChildIsNotASavePoint() async throws {
        let fixture = try await Fixture.make()
        defer { fixture.remove() }
        try await withMount(fixture.store, configure: { $0.fileSystem.quietInterval = .seconds(60) }) {
            mount in
            let path = mount.path + "/Project.pkg/notes.txt"
            let before = try #require(try stored(fixture, "Project.pkg", "notes.txt"))
            let fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC)
            try #require(fd >= 0)
            let half = Array("half".utf8)
            #expect(write(fd, half, half.count) == half.count)
            // The exec closes the child's copy of the descriptor: the kernel sends FLUSH from it.
            let child = try await offThread { try run("/bin/true", []) }
            #expect(child.status == 0)
            // Closes are committed in the background within milliseconds: give a wrong save
            // from the child's FLUSH far more than that to show.
            try await Task.sleep(for: .milliseconds(300))
            #expect(try stored(fixture, "Project.pkg", "notes.txt") == before)
            #expect(close(fd) == 0)
            try await expectEventually("the writer's close saved") {
                try stored(fixture, "Project.pkg", "notes.txt") == before + "half"
            }
        }
    }

    @Test("an fsync whose intent log cannot be written saves durably instead, and returns 0")
    func fsyncWithoutItsLog() async throws {
        let fixture = try await Fixture.make(.sqlite)
        defer { fixture.remove() }
        let sqlite = try #require(fixture.store as? SQLiteStore)
        // A file where the log's folder goes: the log cannot be made.
        try Data("not a folder".utf8).write(to: URL(fileURLWithPath: sqlite.path + "-intents"))
        try await withMount(fixture.store) { mount in
            mount.mount.fileSystem.holdBackgroundSaves(true)
            let bytes = sampleBytes(10_000, seed: 77)
            let status = try await offThread { () -> Int32 in
                let fd = open(mount.path + "/Project.pkg/unlogged.bin", O_CREAT | O_RDWR | O_CLOEXEC, 0o644)
                guard fd >= 0 else { return errno }
                defer { close(fd) }
                guard bytes.withUnsafeBytes({ pwrite(fd, $0.baseAddress, $0.count, 0) }) == bytes.count else {
                    return errno
                }
                return fsync(fd) == 0 ? 0 : errno
            }
            #expect(status == 0)
            // Saved by the fsync itself: the committer is held.
            let record = try fixture.record("Project.pkg", "unlogged.bin")
            #expect(
                try fixture.reopen().readContents(of: record.id, at: nil, offset: 0, count: bytes.count)
                    == bytes)
            mount.mount.fileSystem.holdBackgroundSaves(false)
        }
    }

    @Test(
        "fsync makes a write durable before it returns (in SQLite's intent log, replayed from a crash image); its save follows",
        arguments: StoreKind.all)
    func fsyncAndLarge(_ kind: StoreKind) async throws {
        let fixture = try await Fixture.make(kind)
        defer { fixture.remove() }
        try await withMount(fixture.store) { mount in
            let fs = mount.mount.fileSystem
            // Nothing saves in the background until the image is taken: only what the fsync
            // itself made durable is in it.
            let sqlite = holdBackgroundWork(fs, fixture)
            let p = mount.path + "/Project.pkg/big.bin"
            let ok = try await offThread { () -> Bool in
                let fd = open(p, O_RDWR | O_CLOEXEC)
                guard fd >= 0 else { return false }
                defer { close(fd) }
                let bytes = [UInt8](repeating: 0x41, count: 5000)
                // Straddles the first chunk boundary, so two chunks are taken in and changed.
                guard pwrite(fd, bytes, bytes.count, off_t(Fixture.chunkSize - 2500)) == bytes.count else {
                    return false
                }
                return fsync(fd) == 0
            }
            #expect(ok)
            let record = try fixture.record("Project.pkg", "big.bin")
            var expected = Fixture.bigContents()
            expected.replaceSubrange(
                (Fixture.chunkSize - 2500)..<(Fixture.chunkSize + 2500),
                with: Data(repeating: 0x41, count: 5000))
            if let sqlite {
                // The store's files as a kill -9 of the daemon would leave them.
                try withCrashImage(of: sqlite.path) { image in
                    // Not saved yet: the write is in the log, whose record the image's opening saves.
                    #expect(
                        try fixture.reopen().readContents(
                            of: record.id, at: nil, offset: 0, count: Fixture.bigSize) != expected)
                    let logs = { try FileManager.default.contentsOfDirectory(atPath: image + "-intents") }
                    #expect(try logs().filter { $0.hasSuffix(".log") }.count == 1)
                    let recovered = try SQLiteStore(path: image)
                    #expect(
                        try recovered.readContents(of: record.id, at: nil, offset: 0, count: Fixture.bigSize)
                            == expected)
                    #expect(try logs().isEmpty, "a replayed log is removed")
                    #expect(try recovered.checkIntegrity().isClean)
                }
                sqlite.resumeBackgroundCheckpoints()
            } else {
                // A store without a log: the fsync was a durable save.
                #expect(
                    try fixture.reopen().readContents(
                        of: record.id, at: nil, offset: 0, count: Fixture.bigSize) == expected)
            }
            fs.holdBackgroundSaves(false)
            let final = expected
            _ = try await expectEventually("the fsync's save committed") {
                try fixture.reopen().readContents(of: record.id, at: nil, offset: 0, count: Fixture.bigSize)
                    == final
            }
            let versions = try fixture.reopen().versions(of: record.document)
            #expect(versions.last?.bytesWritten ?? 0 <= Int64(2 * Fixture.chunkSize))
        }
    }

    @Test(
        "a safe-save's rename returns without waiting for the store, and its fsyncdir makes it durable",
        arguments: StoreKind.all)
    func safeSaveDurableAtFsyncdir(_ kind: StoreKind) async throws {
        let fixture = try await Fixture.make(kind)
        defer { fixture.remove() }
        try await withMount(fixture.store) { mount in
            let fs = mount.mount.fileSystem
            let sqlite = holdBackgroundWork(fs, fixture)
            let folder = mount.path + "/Project.pkg/src"
            let text = "print(\"saved safely\")\n"
            // As GIO saves: a temporary file, fsync, rename over the file, fsync of the folder.
            let steps = try await offThread { () -> [Int32] in
                let temporary = folder + "/.goutputstream-Q1W2E3"
                let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
                guard fd >= 0 else { return [errno] }
                let bytes = Array(text.utf8)
                let wrote = write(fd, bytes, bytes.count) == bytes.count ? 0 : errno
                let synced = fsync(fd) == 0 ? 0 : errno
                close(fd)
                let renamed = rename(temporary, folder + "/main.swift") == 0 ? 0 : errno
                return [wrote, synced, renamed]
            }
            #expect(steps == [0, 0, 0])
            // Renamed, not saved: the save is the committer's, which is held.
            #expect(try stored(fixture, "Project.pkg", "src", "main.swift") == "print(\"hello\")\n")
            let synced = try await offThread { () -> Int32 in
                let fd = open(folder, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
                guard fd >= 0 else { return errno }
                defer { close(fd) }
                return fsync(fd) == 0 ? 0 : errno
            }
            #expect(synced == 0)
            if let sqlite {
                // The store's files as a kill -9 of the daemon would leave them: the rename and
                // the new bytes are in the intent log, which the image's opening saves.
                try withCrashImage(of: sqlite.path) { image in
                    let recovered = try SQLiteStore(path: image)
                    #expect(try stored(in: recovered, "Project.pkg", ["src", "main.swift"]) == text)
                    #expect(try recovered.checkIntegrity().isClean)
                }
                sqlite.resumeBackgroundCheckpoints()
            } else {
                // A store without a log: the fsyncdir was a durable save.
                #expect(try stored(fixture, "Project.pkg", "src", "main.swift") == text)
            }
            fs.holdBackgroundSaves(false)
            _ = try await expectEventually("the safe-save committed") {
                try self.stored(fixture, "Project.pkg", "src", "main.swift") == text
            }
            #expect(try names(fixture, "Project.pkg").allSatisfy { !$0.hasPrefix(".goutputstream") })
        }
    }
}

/// Which names are editors' and tools' scratch files (docs/design/fuse-notes.md §3).
struct ScratchNameTests {
    @Test(
        "swap, backup, lock and temporary names are scratch",
        arguments: [
            ".notes.txt.swp", ".notes.txt.swo", ".notes.txt.swx", "notes.txt~", "4913", "5036", "#notes.txt#",
            ".#notes.txt",
            "sedAb12Cd", ".goutputstream-X1Y2Z3", ".~lock.report.odt#", "lu12345.tmp", "notes.txt.kate-swp",
            "XXJaCZx4", ".notes.txt.aB3dEf", ".DS_Store", "._notes.txt", "Thumbs.db", "thumbs.db",
            "ehthumbs.db",
            "desktop.ini", "Desktop.ini",
        ])
    func scratch(_ name: String) {
        #expect(ScratchNames.standard.matches(FUSE.FileName(name)))
    }

    @Test(
        "ordinary names are not scratch",
        arguments: [
            "notes.txt", "main.swift", ".main.swift", "4914", "5000", ".profile.backup", ".config",
            "sedation", "README", "image.png",
            ".hidden.ABCDEF", "a#b", "lu.txt",
        ])
    func ordinary(_ name: String) {
        #expect(!ScratchNames.standard.matches(FUSE.FileName(name)))
    }

    @Test("-o housekeeping=keep: file managers' files are ordinary, editors' stay scratch")
    func housekeepingKept() {
        for name in [".DS_Store", "._notes.txt", "Thumbs.db", "desktop.ini"] {
            #expect(!ScratchNames.editorsOnly.matches(FUSE.FileName(name)), "\(name)")
        }
        #expect(ScratchNames.editorsOnly.matches(".notes.txt.swp"))
    }
}

/// A full disk under the store: the save fails with ENOSPC at close and fsync, nothing saved
/// before is lost, and the mount keeps serving.
@Suite(.serialized)
struct FullDiskTests {
    @Test(
        "a save that fills the store's disk fails at fsync and at the close after it with ENOSPC; earlier saves stay intact"
    )
    func fullDisk() async throws {
        let directory = try temporaryDirectory("docfs-full")
        defer { rmdir(directory) }
        let mounted = try run("/bin/mount", ["-t", "tmpfs", "-o", "size=6m", "tmpfs", directory])
        try #require(mounted.status == 0, "mount tmpfs: \(mounted.error)")
        defer { _ = try? run("/bin/umount", ["-l", directory]) }
        let path = directory + "/S.docstore"
        let store = try SQLiteStore(path: path, options: .create, chunkSize: 64 * 1024)
        _ = try store.createDocument(
            named: "Doc.pkg", kind: .package, type: nil, permissions: 0o755, origin: "test")
        let spill = try temporaryDirectory("docfs-spill")
        defer { try? FileManager.default.removeItem(atPath: spill) }
        try await withMount(store, configure: { $0.fileSystem.spillDirectory = spill }) { mount in
            let p = mount.path + "/Doc.pkg"
            let first = try await sh("printf 'kept\\n' > kept.txt", in: p)
            #expect(first.status == 0)
            let results = try await offThread { () -> (write: Int32, close: Int32) in
                let fd = open(p + "/huge.bin", O_CREAT | O_WRONLY | O_CLOEXEC, 0o644)
                guard fd >= 0 else { return (errno, 0) }
                var bytes = [UInt8](repeating: 0, count: 1 << 20)
                var x: UInt32 = 7
                var writeError: Int32 = 0
                for i in 0..<12 {
                    // Random bytes throughout, so nothing deduplicates.
                    for j in bytes.indices {
                        x ^= x << 13
                        x ^= x >> 17
                        x ^= x << 5
                        bytes[j] = UInt8(truncatingIfNeeded: x)
                    }
                    if pwrite(fd, bytes, bytes.count, off_t(i << 20)) < 0 {
                        writeError = errno
                        break
                    }
                }
                // The save (fsync's, as the committer's after a close) hits the full disk; the
                // close after it reports the failed save too.
                let synced = fsync(fd) == 0 ? 0 : errno
                let closed = close(fd) == 0 ? 0 : errno
                return (writeError, synced == 0 ? closed : synced == closed ? closed : -synced)
            }
            // The writes wait in the spill folder (another disk).
            #expect(results.write == 0)
            #expect(results.close == ENOSPC)
            // The mount goes on serving, and what was saved before is intact.
            let read = try await sh("cat kept.txt", in: p)
            #expect(read.output == "kept\n")
            let removed = try await sh("rm huge.bin && printf 'after\\n' > after.txt", in: p)
            #expect(removed.status == 0, "\(removed.error)")
        }
        let check = try SQLiteStore(path: path)
        let info = try #require(try check.document(named: "Doc.pkg"))
        let names = Set(try check.nodes(of: info.id).map(\.name))
        #expect(names.contains("kept.txt") && names.contains("after.txt") && !names.contains("huge.bin"))
        #expect(try check.checkIntegrity().isClean)
    }
}
