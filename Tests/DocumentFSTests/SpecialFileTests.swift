import CLinuxSupport
import DocumentEngine
import DocumentFS
import Foundation
import StoreTestSupport
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Binds a Unix socket at `path` (creating a socket file, as a server does) and closes it.
func bindSocket(_ path: String) -> Int32 {
    let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { return -1 }
    defer { close(fd) }
    var address = sockaddr_un()
    address.sun_family = sa_family_t(AF_UNIX)
    let bytes = Array(path.utf8)
    guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else {
        errno = ENAMETOOLONG
        return -1
    }
    withUnsafeMutableBytes(of: &address.sun_path) { raw in
        for (index, byte) in bytes.enumerated() { raw[index] = byte }
    }
    return withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
            bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
        }
    }
}

/// Fifos, sockets and devices are wrappers with no contents, anywhere in a mount: in packages,
/// and at the root as flat documents; symbolic links at the root are documents too.
@Suite(.serialized)
struct SpecialFileTests {
    static let isRoot = geteuid() == 0

    @Test(
        "fifos, sockets and devices: created in a package and at the root, changed, renamed, removed, kept by the store",
        arguments: StoreKind.all)
    func specialFiles(_ kind: StoreKind) async throws {
        let fixture = try Fixture.small(kind)
        let engine = try Engine(fixture)
        let device = UInt64(deviceNumber(1, 3))
        try await withMount(fixture.store) { mount in
            let p = mount.path
            let short = try await offThread { () throws -> (Int32, Int32) in
                try sys(mkfifo(p + "/Work.pkg/pipe", 0o644), "mkfifo")
                try sys(mkfifo(p + "/Pipe", 0o600), "mkfifo at the root")
                if Self.isRoot {
                    try sys(mknod(p + "/Work.pkg/null", S_IFCHR | 0o666, dev_t(device)), "mknod c")
                    try sys(
                        mknod(p + "/Work.pkg/disk", S_IFBLK | 0o600, dev_t(deviceNumber(7, 0))), "mknod b")
                    try sys(mknod(p + "/Null", S_IFCHR | 0o644, dev_t(device)), "mknod at the root")
                } else {
                    #expect(errnoOf(mknod(p + "/Work.pkg/null", S_IFCHR | 0o666, dev_t(device))) == EPERM)
                }
                // A socket path must fit sockaddr_un: bind through a short relative path.
                let cwd = open(".", O_RDONLY)
                defer {
                    _ = fchdir(cwd)
                    close(cwd)
                }
                try sys(chdir(p + "/Work.pkg"))
                let socketResult = errnoOf(bindSocket("sock"))
                try sys(chdir(p))
                let rootSocketResult = errnoOf(bindSocket("Socket"))
                return (socketResult, rootSocketResult)
            }
            #expect(short == (0, 0))

            // Types, modes and device numbers as created (less the umask).
            let types = try await offThread {
                try [
                    "pipe": lstatOf(p + "/Work.pkg/pipe").st_mode, "Pipe": lstatOf(p + "/Pipe").st_mode,
                    "sock": lstatOf(p + "/Work.pkg/sock").st_mode, "Socket": lstatOf(p + "/Socket").st_mode,
                ]
            }
            #expect(types["pipe"].map { $0 & S_IFMT } == S_IFIFO)
            #expect(types["Pipe"].map { $0 & S_IFMT } == S_IFIFO)
            #expect(types["sock"].map { $0 & S_IFMT } == S_IFSOCK)
            #expect(types["Socket"].map { $0 & S_IFMT } == S_IFSOCK)
            #expect(types["Pipe"].map { $0 & 0o7777 } == 0o600)
            if Self.isRoot {
                let null = try await offThread { try lstatOf(p + "/Work.pkg/null") }
                #expect(null.st_mode & S_IFMT == S_IFCHR)
                #expect(UInt64(null.st_rdev) == device)
                #expect(try await offThread { try lstatOf(p + "/Work.pkg/disk").st_mode & S_IFMT } == S_IFBLK)
                #expect(try await offThread { UInt64(try lstatOf(p + "/Null").st_rdev) } == device)
            }

            // A fifo in the mount is a real pipe (the kernel serves its I/O).
            let echoed = try await offThread { () throws -> String in
                let fd = try sys(open(p + "/Work.pkg/pipe", O_RDWR), "open the fifo")
                defer { close(fd) }
                _ = try sys(write(fd, "through the pipe", 16))
                var buffer = [UInt8](repeating: 0, count: 16)
                let count = try sys(read(fd, &buffer, 16))
                return String(decoding: buffer[0..<count], as: UTF8.self)
            }
            #expect(echoed == "through the pipe")

            // chmod, chown, utimensat, rename and unlink.
            try await offThread {
                try sys(chmod(p + "/Work.pkg/pipe", 0o640))
                if Self.isRoot { try sys(lchown(p + "/Work.pkg/pipe", 1234, 5678)) }
                var times = [
                    timespec(tv_sec: 1_600_000_000, tv_nsec: 5), timespec(tv_sec: 1_600_000_001, tv_nsec: 7),
                ]
                try sys(utimensat(AT_FDCWD, p + "/Work.pkg/pipe", &times, AT_SYMLINK_NOFOLLOW))
                try sys(rename(p + "/Work.pkg/pipe", p + "/Work.pkg/sub/pipe2"))
                try sys(unlink(p + "/Work.pkg/sock"))
                try sys(rename(p + "/Pipe", p + "/Pipe2"))
                try sys(unlink(p + "/Socket"))
            }
            let moved = try await offThread { try lstatOf(p + "/Work.pkg/sub/pipe2") }
            #expect(moved.st_mode & 0o7777 == 0o640)
            #expect(moved.st_mtim.tv_sec == 1_600_000_001 && moved.st_mtim.tv_nsec == 7)
        }

        // The store keeps them as metadata-only wrappers.
        let pipe = try #require(try engine.record("Work.pkg", "sub/pipe2"))
        #expect(pipe.kind == .fifo)
        #expect(pipe.size == 0)
        #expect(pipe.permissions == 0o640)
        #expect(pipe.modified == Timestamp(seconds: 1_600_000_001, nanoseconds: 7))
        if Self.isRoot { #expect(pipe.uid == 1234 && pipe.gid == 5678) }
        #expect(try engine.record("Work.pkg", "sock") == nil)
        #expect(try engine.record("Pipe2")?.kind == .fifo)
        #expect(try engine.document("Pipe2").kind == .flat)
        #expect(try engine.store.document(named: "Socket") == nil)
        if Self.isRoot {
            let null = try #require(try engine.record("Work.pkg", "null"))
            #expect(null.kind == .characterDevice && null.device == device)
            #expect(try engine.record("Work.pkg", "disk")?.kind == .blockDevice)
            #expect(try engine.record("Null")?.device == device)
        }

        // A new mount shows them as they were.
        try await withMount(fixture.store) { mount in
            let p = mount.path
            let again = try await offThread { try lstatOf(p + "/Work.pkg/sub/pipe2") }
            #expect(again.st_mode & S_IFMT == S_IFIFO)
            #expect(again.st_mode & 0o7777 == 0o640)
            #expect(try await offThread { try lstatOf(p + "/Pipe2").st_mode & S_IFMT } == S_IFIFO)
            if Self.isRoot {
                #expect(try await offThread { UInt64(try lstatOf(p + "/Work.pkg/null").st_rdev) } == device)
            }
            #expect(try await offThread { try entries(in: p + "/Work.pkg") }.contains("sock") == false)
        }
    }

    @Test(
        "a symbolic link at the root is a document: readlink, follow, ELOOP, remove", arguments: StoreKind.all
    )
    func linksAtTheRoot(_ kind: StoreKind) async throws {
        let fixture = try Fixture.small(kind)
        let engine = try Engine(fixture)
        try await withMount(fixture.store) { mount in
            let p = mount.path
            try await offThread {
                try sys(symlink("Flat.txt", p + "/Link"))
                try sys(symlink("Work.pkg/notes.txt", p + "/Notes"))
                try sys(symlink("Loop2", p + "/Loop1"))
                try sys(symlink("Loop1", p + "/Loop2"))
            }
            let target = try await offThread { () throws -> String in
                var buffer = [CChar](repeating: 0, count: 256)
                let count = try sys(readlink(p + "/Link", &buffer, 255))
                return String(decoding: buffer[0..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
            }
            #expect(target == "Flat.txt")
            #expect(
                try await offThread { try String(contentsOfFile: p + "/Link", encoding: .utf8) }
                    == Fixture.flatText)
            #expect(
                try await offThread { try String(contentsOfFile: p + "/Notes", encoding: .utf8) }
                    == Fixture.notesText)
            #expect(try await offThread { errnoOf(open(p + "/Loop1", O_RDONLY)) } == ELOOP)
            #expect(try await offThread { try lstatOf(p + "/Link").st_mode & S_IFMT } == S_IFLNK)
        }
        #expect(try engine.record("Link")?.kind == .symbolicLink)
        #expect(try engine.record("Link")?.linkTarget == "Flat.txt")
        #expect(try engine.document("Loop1").kind == .flat)
        try await withMount(fixture.store) { mount in
            let p = mount.path
            #expect(
                try await offThread { try String(contentsOfFile: p + "/Link", encoding: .utf8) }
                    == Fixture.flatText)
            try await offThread {
                try sys(unlink(p + "/Loop1"))
                try sys(rename(p + "/Link", p + "/Link2"))
            }
            #expect(try await offThread { errnoOf(open(p + "/Loop2", O_RDONLY)) } == ENOENT)
        }
        #expect(try engine.store.document(named: "Loop1") == nil)
        #expect(try engine.record("Link2")?.linkTarget == "Flat.txt")
    }
}
