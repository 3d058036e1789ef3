import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// lossyfs mounted for real (the tool of scripts/power-loss.sh): what a power cut keeps and
/// drops. Every test cuts the power with SIGUSR1 and mounts the backing folder again.
@Suite(.serialized) struct LossyFSTests {
    @Test func unsyncedDataIsGoneAfterACut() throws {
        let mount = try LossyMount()
        try write(mount.path("a"), "durable", sync: .fsync)
        try write(mount.path("a"), Array("CHANGED".utf8), at: 0)
        try write(mount.path("a"), Array("tail".utf8), at: 100)
        #expect(contents(mount.path("a"))?.count == 104)
        try mount.cutAndRemount()
        #expect(text(mount.path("a")) == "durable")
        // Nothing of it reached the backing file either.
        #expect(text(mount.backing + "/a") == "durable")
    }

    @Test func fsyncedDataStays() throws {
        let mount = try LossyMount()
        try write(mount.path("a"), "one", sync: .fsync)
        try write(mount.path("a"), "two", sync: .fsync)
        try write(mount.path("a"), Array("X".utf8), at: 5000)
        try mount.cutAndRemount()
        #expect(text(mount.path("a")) == "two")
        // A truncation is held back like a write, and kept by fsync like one.
        let fd = open(mount.path("a"), O_RDWR)
        #expect(ftruncate(fd, 1) == 0)
        close(fd)
        #expect(text(mount.path("a")) == "t")
        try mount.cutAndRemount()
        #expect(text(mount.path("a")) == "two")
    }

    @Test func fdatasyncWorks() throws {
        let mount = try LossyMount()
        try write(mount.path("a"), "kept", sync: .fdatasync)
        try write(mount.path("b"), "lost")
        try mount.cutAndRemount()
        #expect(text(mount.path("a")) == "kept")
        #expect(text(mount.path("b")) == nil)
    }

    @Test func aFileCreatedAndNeverSyncedVanishes() throws {
        let mount = try LossyMount()
        try fsyncDirectory(mount.mountpoint)
        try write(mount.path("new"), "never synced")
        let fd = open(mount.path("empty"), O_CREAT | O_WRONLY, 0o600)
        close(fd)
        try FileManager.default.createDirectory(
            atPath: mount.path("folder"), withIntermediateDirectories: false)
        try write(mount.path("folder/inside"), "synced, but its folder is not", sync: .fsync)
        try mount.cutAndRemount()
        #expect(try FileManager.default.contentsOfDirectory(atPath: mount.mountpoint).isEmpty)
    }

    @Test func fsyncOfTheFolderKeepsANewFile() throws {
        let mount = try LossyMount()
        try write(mount.path("new"), "bytes not synced")
        try fsyncDirectory(mount.mountpoint)
        try mount.cutAndRemount()
        // The name is durable, its bytes are not.
        #expect(text(mount.path("new")) == "")
    }

    @Test func withPosixNamesOnlyTheFolderKeepsANewName() throws {
        let mount = try LossyMount(options: ["-o", "names=posix"])
        try write(mount.path("a"), "synced file, unsynced folder", sync: .fsync)
        try mount.cutAndRemount()
        #expect(text(mount.path("a")) == nil)
        try write(mount.path("b"), "both synced", sync: .fsync)
        try fsyncDirectory(mount.mountpoint)
        try mount.cutAndRemount()
        #expect(text(mount.path("b")) == "both synced")
    }

    @Test func renamesAndUnlinksAreUndone() throws {
        let mount = try LossyMount()
        try write(mount.path("name"), "old", sync: .fsync)
        try write(mount.path("other"), "other", sync: .fsync)
        try fsyncDirectory(mount.mountpoint)
        // A safe-save without the folder's fsync: the rename is not durable, the temporary is.
        try write(mount.path("name.tmp"), "new", sync: .fsync)
        try check(rename(mount.path("name.tmp"), mount.path("name")), "rename")
        try check(unlink(mount.path("other")), "unlink")
        #expect(text(mount.path("name")) == "new")
        try mount.cutAndRemount()
        #expect(text(mount.path("name")) == "old")
        #expect(text(mount.path("name.tmp")) == "new")
        #expect(text(mount.path("other")) == "other")
        // With the folder's fsync both stay done.
        try check(rename(mount.path("name.tmp"), mount.path("name")), "rename")
        try check(unlink(mount.path("other")), "unlink")
        try fsyncDirectory(mount.mountpoint)
        try mount.cutAndRemount()
        #expect(try FileManager.default.contentsOfDirectory(atPath: mount.mountpoint) == ["name"])
        #expect(text(mount.path("name")) == "new")
    }

    @Test func exchangesAndFolderMovesAreUndone() throws {
        let mount = try LossyMount()
        try FileManager.default.createDirectory(atPath: mount.path("d"), withIntermediateDirectories: false)
        try write(mount.path("a"), "A", sync: .fsync)
        try write(mount.path("d/b"), "B", sync: .fsync)
        try fsyncDirectory(mount.mountpoint)
        try fsyncDirectory(mount.path("d"))
        try exchange(mount.path("a"), mount.path("d/b"))
        try check(rename(mount.path("d"), mount.path("e")), "rename")
        #expect(text(mount.path("e/b")) == "A")
        try mount.cutAndRemount()
        #expect(text(mount.path("a")) == "A")
        #expect(text(mount.path("d/b")) == "B")
        #expect(!FileManager.default.fileExists(atPath: mount.path("e")))
    }

    @Test func sqliteInWALModeWorks() throws {
        let mount = try LossyMount()
        let db = mount.path("store.sqlite")
        #expect(try sqlite(db, "PRAGMA journal_mode=WAL") == "wal")
        try fsyncDirectory(mount.mountpoint)
        // A reader and a writer at once share the -shm file through mmap.
        _ = try sqlite(db, "CREATE TABLE t(x); INSERT INTO t VALUES(1),(2),(3)")
        let reader = Process()
        reader.executableURL = URL(fileURLWithPath: "/usr/bin/sqlite3")
        reader.arguments = ["-cmd", ".timeout 5000", db, "BEGIN; SELECT count(*) FROM t; SELECT count(*) FROM t; COMMIT"]
        try reader.run()
        _ = try sqlite(db, "PRAGMA synchronous=FULL; INSERT INTO t VALUES(4)")
        reader.waitUntilExit()
        #expect(reader.terminationStatus == 0)
        // Committed with synchronous=OFF: never synced, so the cut may take it; the database stays whole.
        _ = try sqlite(db, "PRAGMA synchronous=OFF; PRAGMA wal_autocheckpoint=0; INSERT INTO t VALUES(5)")
        try mount.cutAndRemount()
        #expect(try sqlite(db, "PRAGMA integrity_check") == "ok")
        let rows = try sqlite(db, "SELECT group_concat(x) FROM t")
        #expect(rows.hasPrefix("1,2,3,4"), "\(rows)")
    }

    @Test func sharedWritableMmapWorks() throws {
        let mount = try LossyMount()
        let path = mount.path("mapped")
        try write(path, [UInt8](repeating: 0x2E, count: 8192), sync: .fsync)
        try fsyncDirectory(mount.mountpoint)
        let fd = try check(open(path, O_RDWR), "open")
        defer { close(fd) }
        guard let map = mmap(nil, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), map != MAP_FAILED else {
            throw LossyFailure("mmap: \(errno)")
        }
        defer { munmap(map, 8192) }
        map.storeBytes(of: 0x41, toByteOffset: 0, as: UInt8.self)
        try check(msync(map, 8192, MS_SYNC), "msync")
        map.storeBytes(of: 0x42, toByteOffset: 4096, as: UInt8.self)
        // Another descriptor reads what the map holds.
        #expect(contents(path)?[0] == 0x41)
        #expect(contents(path)?[4096] == 0x42)
        try mount.cut()
        try mount.mount()
        // msync (an fsync of the range) kept the first page; the second was only written back.
        #expect(contents(path)?[0] == 0x41)
        #expect(contents(path)?[4096] == 0x2E)
    }

    /// Linux sends a /dev/fuse mount no FUSE_SYNCFS (only virtiofs and fuseblk get it), and
    /// sync_file_range never sends FUSE_FSYNC: neither makes anything durable here.
    @Test func syncfsAndSyncFileRangeMakeNothingDurable() throws {
        let mount = try LossyMount()
        try write(mount.path("a"), "durable", sync: .fsync)
        try write(mount.path("a"), Array("WRITTEN".utf8))
        try write(mount.path("new"), "never synced")
        let fd = try check(open(mount.path("a"), O_RDWR), "open")
        try check(libc("syncfs", as: (@convention(c) (Int32) -> Int32).self)(fd), "syncfs")
        let syncFileRange = libc(
            "sync_file_range", as: (@convention(c) (Int32, Int, Int, UInt32) -> Int32).self)
        try check(syncFileRange(fd, 0, 0, 1 | 2 | 4), "sync_file_range")
        close(fd)
        try mount.cutAndRemount()
        #expect(text(mount.path("a")) == "durable")
        #expect(text(mount.path("new")) == nil)
    }

    /// SIGUSR2 does what syncfs would: every write and name change becomes durable.
    @Test func theSyncSignalMakesEverythingDurable() throws {
        let mount = try LossyMount()
        try FileManager.default.createDirectory(atPath: mount.path("d"), withIntermediateDirectories: false)
        try write(mount.path("d/a"), "never fsynced")
        try mount.signal(SIGUSR2, until: "sync:")
        try write(mount.path("d/b"), "after the sync")
        try mount.cutAndRemount()
        #expect(text(mount.path("d/a")) == "never fsynced")
        #expect(text(mount.path("d/b")) == nil)
    }

    @Test func aCutEndsTheMountForItsUsers() throws {
        let mount = try LossyMount()
        try write(mount.path("open"), "x", sync: .fsync)
        let fd = try check(open(mount.path("open"), O_RDWR), "open")
        defer { close(fd) }
        try mount.cut()
        var byte: UInt8 = 0
        #expect(pread(fd, &byte, 1, 0) < 0)
        #expect([ENOTCONN, ECONNABORTED, EIO].contains(errno))
        try mount.mount()
        #expect(text(mount.path("open")) == "x")
    }

    @Test func aCleanUnmountKeepsEverything() throws {
        let mount = try LossyMount()
        try write(mount.path("a"), "never synced")
        try FileManager.default.createDirectory(atPath: mount.path("d"), withIntermediateDirectories: false)
        try mount.unmount()
        try mount.mount()
        #expect(text(mount.path("a")) == "never synced")
        var isDirectory: ObjCBool = false
        #expect(
            FileManager.default.fileExists(atPath: mount.path("d"), isDirectory: &isDirectory)
                && isDirectory.boolValue)
    }
}
