import FUSE
import Foundation
import SystemPackage
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

struct TestFailure: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// The mount table as (source, mount point, type, options), read a line at a time with stdio:
/// Foundation reads only the first page of a /proc file.
func mountTable() -> [(source: String, mountPoint: String, type: String, options: String)] {
    guard let file = fopen("/proc/self/mounts", "r") else { return [] }
    defer { fclose(file) }
    var result: [(source: String, mountPoint: String, type: String, options: String)] = []
    var line: UnsafeMutablePointer<CChar>?
    var capacity = 0
    defer { free(line) }
    while getline(&line, &capacity, file) > 0, let line {
        let fields = String(cString: line).split(separator: " ").map(String.init)
        if fields.count >= 4 { result.append((fields[0], fields[1], fields[2], fields[3])) }
    }
    return result
}

/// Mounts whose mount point is `path`, as /proc/self/mounts lines ("source mountpoint type options 0 0").
func mountLines(_ path: String) -> [String] {
    mountTable().filter { $0.mountPoint == path }.map {
        "\($0.source) \($0.mountPoint) \($0.type) \($0.options) 0 0"
    }
}

func isMounted(_ path: String) -> Bool { !mountLines(path).isEmpty }

/// A filesystem mounted in a fresh directory under /tmp and served on background threads.
final class TestMount: Sendable {
    let path: String
    let session: Session
    let fs: MemoryFS

    init(_ fs: MemoryFS = MemoryFS(), configure: (inout MountOptions) -> Void = { _ in }) throws {
        var template = Array("/tmp/fusetest.XXXXXX".utf8CString)
        guard let dir = mkdtemp(&template) else { throw Errno(rawValue: errno) }
        path = String(cString: dir)
        self.fs = fs
        var options = MountOptions()
        options.fsName = "memoryfs"
        options.subtype = "memoryfs"
        options.drainTimeout = .seconds(2)
        configure(&options)
        options.debug = ProcessInfo.processInfo.environment["FUSE_TEST_DEBUG"] != nil
        do {
            session = try Session(filesystem: fs, mountpoint: path, options: options)
            try session.start()
        } catch {
            rmdir(path)
            throw error
        }
        // Until the mount is listed, paths would reach the directory underneath.
        let deadline = Date().addingTimeInterval(5)
        while !isMounted(path) {
            guard Date() < deadline else {
                session.unmount()
                rmdir(path)
                throw TestFailure("\(path) never appeared in /proc/self/mounts")
            }
            usleep(1000)
        }
        // The kernel's INIT may still be in flight; the first real request waits for it.
        var st = stat()
        _ = lstat(path, &st)
    }

    func url(_ name: String) -> String { path + "/" + name }

    /// Unmounts (idempotent) and removes the directory.
    func close() {
        session.unmount()
        if isMounted(path) {
            // Last resort so a failing test never leaves a mount behind.
            _ = try? run("/bin/fusermount3", ["-u", "-z", path])
        }
        rmdir(path)
    }
}

/// Mounts `fs`, runs `body`, and always unmounts.
func withMount<T>(
    _ fs: MemoryFS = MemoryFS(), configure: (inout MountOptions) -> Void = { _ in },
    _ body: (TestMount) async throws -> T
) async throws -> T {
    let mount = try TestMount(fs, configure: configure)
    do {
        let result = try await body(mount)
        mount.close()
        return result
    } catch {
        mount.close()
        throw error
    }
}

/// Runs a shell script in `directory` (off the cooperative pool).
func sh(_ script: String, in directory: String) async throws -> ProcessResult {
    try await offThread { try run("/bin/sh", ["-c", script], directory: directory) }
}

/// Calls a libc function that returns -1 and sets errno on failure.
@discardableResult
func sys(_ rc: Int32) throws(Errno) -> Int32 {
    if rc < 0 { throw Errno(rawValue: errno) }
    return rc
}

@discardableResult
func sys(_ rc: Int) throws(Errno) -> Int {
    if rc < 0 { throw Errno(rawValue: errno) }
    return rc
}

/// The errno a throwing call fails with, or nil if it succeeds.
func errnoOf(_ body: () throws -> Void) -> Errno? {
    do {
        try body()
        return nil
    } catch let error as Errno {
        return error
    } catch {
        return nil
    }
}

func lstatOf(_ path: String) throws(Errno) -> stat {
    var st = stat()
    try sys(lstat(path, &st))
    return st
}

func writeFile(_ path: String, _ contents: String) throws {
    let fd = try FileDescriptor.open(
        path, .writeOnly, options: [.create, .truncate], permissions: [.ownerReadWrite])
    try fd.closeAfter { _ = try fd.writeAll(Array(contents.utf8)) }
}

func readFile(_ path: String) throws -> String {
    let fd = try FileDescriptor.open(path, .readOnly)
    return try fd.closeAfter {
        var result: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = try buffer.withUnsafeMutableBytes { try fd.read(into: $0) }
            if n == 0 { break }
            result += buffer[..<n]
        }
        return String(decoding: result, as: UTF8.self)
    }
}

/// One read(2) of up to 64 bytes (readFile would read again until end of file). The close
/// error is ignored: tests use it while the session ends.
func readOnce(_ path: String) throws -> String {
    let fd = try FileDescriptor.open(path, .readOnly)
    defer { try? fd.close() }
    var buffer = [UInt8](repeating: 0, count: 64)
    let n = try buffer.withUnsafeMutableBytes { try fd.read(into: $0) }
    return String(decoding: buffer[..<n], as: UTF8.self)
}

/// renameat2(2), looked up at run time: Swift's Glibc does not declare it.
func renameat2(_ from: String, _ to: String, flags: UInt32) throws(Errno) {
    typealias Function =
        @convention(c) (
            Int32, UnsafePointer<CChar>?, Int32, UnsafePointer<CChar>?, UInt32
        ) -> Int32
    guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "renameat2") else {
        throw .noFunction
    }
    let function = unsafeBitCast(symbol, to: Function.self)
    try sys(function(AT_FDCWD, from, AT_FDCWD, to, flags))
}

/// Entries of /proc/self/<dir>.
func procEntries(_ dir: String) -> [String] {
    (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/" + dir)) ?? []
}

/// Names (comm) of this process's threads.
func threadNames() -> [String] {
    procEntries("task").compactMap {
        try? String(contentsOfFile: "/proc/self/task/\($0)/comm", encoding: .utf8)
            .trimmingCharacters(in: .whitespacesAndNewlines)
    }
}

/// Open descriptors pointing at /dev/fuse.
func fuseDescriptorCount() -> Int {
    procEntries("fd").filter {
        (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/" + $0)) == "/dev/fuse"
    }.count
}

/// Polls `condition` every 10 ms for up to `timeout` (for kernel-driven events like forget).
func eventually(timeout: Double = 3, _ condition: () -> Bool) -> Bool {
    let deadline = Date().addingTimeInterval(timeout)
    while Date() < deadline {
        if condition() { return true }
        usleep(10_000)
    }
    return condition()
}

// Functions Swift's Glibc module does not declare (they need _GNU_SOURCE or sys/xattr.h),
// looked up at run time.

private func libc<F>(_ name: String, as type: F.Type) -> F {
    guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), name) else {
        fatalError("libc has no \(name)")
    }
    return unsafeBitCast(symbol, to: type)
}

func setxattr(_ path: String, _ name: String, _ value: [UInt8], _ size: Int, _ flags: Int32) -> Int32 {
    let f = libc(
        "setxattr",
        as: (@convention(c) (UnsafePointer<CChar>?, UnsafePointer<CChar>?, UnsafeRawPointer?, Int, Int32) ->
            Int32).self)
    return value.withUnsafeBytes { f(path, name, $0.baseAddress, size, flags) }
}

func getxattr(_ path: String, _ name: String, _ value: UnsafeMutableRawPointer?, _ size: Int) -> Int {
    let f = libc(
        "getxattr",
        as: (@convention(c) (UnsafePointer<CChar>?, UnsafePointer<CChar>?, UnsafeMutableRawPointer?, Int) ->
            Int).self)
    return f(path, name, value, size)
}

func listxattr(_ path: String, _ list: UnsafeMutablePointer<CChar>?, _ size: Int) -> Int {
    let f = libc(
        "listxattr",
        as: (@convention(c) (UnsafePointer<CChar>?, UnsafeMutablePointer<CChar>?, Int) -> Int).self)
    return f(path, list, size)
}

func removexattr(_ path: String, _ name: String) -> Int32 {
    let f = libc(
        "removexattr", as: (@convention(c) (UnsafePointer<CChar>?, UnsafePointer<CChar>?) -> Int32).self)
    return f(path, name)
}

func fallocate(_ fd: Int32, _ mode: Int32, _ offset: Int, _ length: Int) -> Int32 {
    let f = libc("fallocate", as: (@convention(c) (Int32, Int32, Int, Int) -> Int32).self)
    return f(fd, mode, offset, length)
}

func copy_file_range(
    _ fdIn: Int32, _ offIn: UnsafeMutablePointer<Int>?, _ fdOut: Int32, _ offOut: UnsafeMutablePointer<Int>?,
    _ length: Int, _ flags: UInt32
) -> Int {
    let f = libc(
        "copy_file_range",
        as: (@convention(c) (
            Int32, UnsafeMutablePointer<Int>?, Int32, UnsafeMutablePointer<Int>?, Int, UInt32
        ) -> Int).self)
    return f(fdIn, offIn, fdOut, offOut, length, flags)
}
