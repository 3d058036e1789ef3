// The file operations the benchmark times, done with plain system calls so that the DocFS
// mount and the native folder see exactly the same requests.

import DocumentEngine
import Foundation

#if canImport(Glibc)
    import Glibc
#endif

struct SystemError: Error, CustomStringConvertible {
    var what: String
    var code: Int32
    init(_ what: String, _ code: Int32 = errno) {
        self.what = what
        self.code = code
    }
    var description: String { "\(what): \(String(cString: strerror(code)))" }
}

/// Nanoseconds on the monotonic clock.
func now() -> UInt64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return UInt64(ts.tv_sec) * 1_000_000_000 + UInt64(ts.tv_nsec)
}

func seconds(since start: UInt64) -> Double { Double(now() - start) / 1e9 }

func format(_ value: Double) -> String { String(format: "%.3f", value) }

/// xorshift64*: fast enough to fill gigabytes, and pseudo-random, so that the store's
/// content deduplication never finds two equal chunks.
struct PseudoRandom {
    var state: UInt64
    init(seed: UInt64) { state = seed == 0 ? 0x9E37_79B9_7F4A_7C15 : seed }
    mutating func next() -> UInt64 {
        state ^= state >> 12
        state ^= state << 25
        state ^= state >> 27
        return state &* 0x2545_F491_4F6C_DD1D
    }
    mutating func fill(_ buffer: UnsafeMutableRawBufferPointer) {
        let words = buffer.count / 8
        let base = buffer.baseAddress!
        for i in 0..<words { base.storeBytes(of: next(), toByteOffset: i * 8, as: UInt64.self) }
        for i in (words * 8)..<buffer.count { buffer[i] = UInt8(truncatingIfNeeded: next()) }
    }
}

func openFile(_ path: String, _ flags: Int32, _ mode: mode_t = 0o644) throws -> Int32 {
    let fd = open(path, flags | O_CLOEXEC, mode)
    guard fd >= 0 else { throw SystemError("open \(path)") }
    return fd
}

func writeAll(_ fd: Int32, _ buffer: UnsafeRawBufferPointer, path: String) throws {
    var done = 0
    while done < buffer.count {
        let n = write(fd, buffer.baseAddress! + done, buffer.count - done)
        if n < 0 {
            if errno == EINTR { continue }
            throw SystemError("write \(path)")
        }
        done += n
    }
}

func closeChecked(_ fd: Int32, path: String) throws {
    // A DocFS close is a save point: its error is the save's.
    guard close(fd) == 0 else { throw SystemError("close \(path)") }
}

func fsyncChecked(_ fd: Int32, path: String) throws {
    guard fsync(fd) == 0 else { throw SystemError("fsync \(path)") }
}

extension Data {
    static func writePseudoRandom(to path: String, count: Int, seed: UInt64) throws {
        let fd = try openFile(path, O_WRONLY | O_CREAT | O_TRUNC)
        var random = PseudoRandom(seed: seed &+ UInt64(truncatingIfNeeded: path.hashValue))
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        var left = count
        while left > 0 {
            let n = Swift.min(left, buffer.count)
            try buffer.withUnsafeMutableBytes { raw in
                random.fill(raw)
                try writeAll(fd, UnsafeRawBufferPointer(rebasing: raw[0..<n]), path: path)
            }
            left -= n
        }
        try closeChecked(fd, path: path)
    }
}

/// Numbered lines of text, `count` bytes in all.
func makeText(at path: String, count: Int) throws {
    var text = ""
    text.reserveCapacity(count + 100)
    var line = 1
    while text.utf8.count < count {
        text += String(format: "line %07d: the quick brown fox jumps over the lazy dog\n", line)
        line += 1
    }
    let bytes = Array(text.utf8.prefix(count))
    let fd = try openFile(path, O_WRONLY | O_CREAT | O_TRUNC)
    try bytes.withUnsafeBytes { try writeAll(fd, $0, path: path) }
    try closeChecked(fd, path: path)
}

func fileName(_ index: Int) -> String { String(format: "f%05d", index) }

/// `count` files of `size` distinct bytes each.
func makeFiles(in directory: String, count: Int, size: Int) throws {
    var random = PseudoRandom(seed: 7)
    var buffer = [UInt8](repeating: 0, count: size)
    for index in 0..<count {
        let path = directory + "/" + fileName(index)
        let fd = try openFile(path, O_WRONLY | O_CREAT | O_TRUNC)
        try buffer.withUnsafeMutableBytes { raw in
            random.fill(raw)
            try writeAll(fd, UnsafeRawBufferPointer(raw), path: path)
        }
        try closeChecked(fd, path: path)
    }
}

/// `count` small package documents (a 4 KiB text and 16 KiB of data each), in the folder
/// `native` and imported into the store at `store`: the root-listing and many-documents figures.
func makeRoots(store storePath: String, native: String, count: Int) throws {
    let store = try openStore(storePath)
    for index in 0..<count {
        let name = String(format: "doc-%04d.pkg", index)
        let folder = native + "/" + name
        guard mkdir(folder, 0o755) == 0 || errno == EEXIST else { throw SystemError("mkdir \(folder)") }
        try makeText(at: folder + "/text.txt", count: 4096)
        try Data.writePseudoRandom(to: folder + "/data.bin", count: 16384, seed: UInt64(index + 1))
        try store.importItem(at: URL(fileURLWithPath: folder))
    }
}

// MARK: - Timed operations

/// B2: appends a line and makes it durable, as an editor's "append and save" would.
func appendLine(to path: String, text: String) throws -> Double {
    let bytes = Array((text + "\n").utf8)
    let start = now()
    let fd = try openFile(path, O_WRONLY | O_APPEND)
    try bytes.withUnsafeBytes { try writeAll(fd, $0, path: path) }
    try fsyncChecked(fd, path: path)
    try closeChecked(fd, path: path)
    return seconds(since: start) * 1000
}

/// B2: replaces `destination`'s contents with `source`'s in place (truncate, write, fsync).
func replaceFile(_ destination: String, with source: String) throws -> Double {
    guard let contents = FileManager.default.contents(atPath: source) else {
        throw SystemError("read \(source)", ENOENT)
    }
    let start = now()
    let fd = try openFile(destination, O_WRONLY | O_CREAT | O_TRUNC)
    try contents.withUnsafeBytes { try writeAll(fd, $0, path: destination) }
    try fsyncChecked(fd, path: destination)
    try closeChecked(fd, path: destination)
    return seconds(since: start) * 1000
}

/// B3: writes `count` bytes in 1 MiB writes, fsyncs and closes; MiB/s over all of it.
///
/// One pseudo-random buffer, with every 4 KiB stamped with its offset and a per-run nonce:
/// cheap to produce, yet no two chunks of any run are equal, so deduplication cannot help.
func sequentialWrite(_ path: String, count: Int) throws -> Double {
    let block = 1 << 20
    var random = PseudoRandom(seed: now())
    var buffer = [UInt8](repeating: 0, count: block)
    buffer.withUnsafeMutableBytes { random.fill($0) }
    let nonce = random.next()
    let start = now()
    let fd = try openFile(path, O_WRONLY | O_CREAT | O_TRUNC)
    var offset = 0
    while offset < count {
        let n = min(block, count - offset)
        try buffer.withUnsafeMutableBytes { raw in
            var at = 0
            while at < n {
                raw.storeBytes(of: UInt64(offset + at), toByteOffset: at, as: UInt64.self)
                raw.storeBytes(of: nonce, toByteOffset: at + 8, as: UInt64.self)
                at += 4096
            }
            try writeAll(fd, UnsafeRawBufferPointer(rebasing: raw[0..<n]), path: path)
        }
        offset += n
    }
    try fsyncChecked(fd, path: path)
    try closeChecked(fd, path: path)
    return Double(count) / 1_048_576 / seconds(since: start)
}

/// B3: reads the file to its end in 1 MiB reads; MiB/s.
func sequentialRead(_ path: String) throws -> Double {
    var buffer = [UInt8](repeating: 0, count: 1 << 20)
    let start = now()
    let fd = try openFile(path, O_RDONLY)
    _ = posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL)
    var total = 0
    while true {
        let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        if n < 0 {
            if errno == EINTR { continue }
            throw SystemError("read \(path)")
        }
        if n == 0 { break }
        total += n
    }
    try closeChecked(fd, path: path)
    return Double(total) / 1_048_576 / seconds(since: start)
}

/// B5: creates (write + close) `count` files of `size` bytes, stats them, unlinks them;
/// operations per second of each phase.
func smallFiles(in directory: String, count: Int, size: Int) throws -> (
    create: Double, stat: Double, delete: Double
) {
    var random = PseudoRandom(seed: now())
    var buffer = [UInt8](repeating: 0, count: max(size, 8))
    buffer.withUnsafeMutableBytes { random.fill($0) }
    let paths = (0..<count).map { directory + "/" + fileName($0) }

    var start = now()
    for (index, path) in paths.enumerated() {
        let fd = try openFile(path, O_WRONLY | O_CREAT | O_EXCL)
        try buffer.withUnsafeMutableBytes { raw in
            raw.storeBytes(of: UInt64(index), toByteOffset: 0, as: UInt64.self)
            try writeAll(fd, UnsafeRawBufferPointer(rebasing: raw[0..<size]), path: path)
        }
        try closeChecked(fd, path: path)
    }
    let create = Double(count) / seconds(since: start)

    start = now()
    var st = stat()
    for path in paths where stat(path, &st) != 0 || st.st_size != size {
        throw SystemError("stat \(path)", errno == 0 ? EIO : errno)
    }
    let statRate = Double(count) / seconds(since: start)

    start = now()
    for path in paths where unlink(path) != 0 { throw SystemError("unlink \(path)") }
    let delete = Double(count) / seconds(since: start)
    return (create, statRate, delete)
}

/// B7: opens one file in each of the first `count` documents under `root` (a package's first
/// regular file, or a flat document itself), reads 4 KiB of each, and with all of them open
/// reads the daemon's peak and current resident set size (KiB).
func holdOpen(root: String, count: Int, daemon: pid_t) throws -> (hwm: Int, rss: Int) {
    let names = try FileManager.default.contentsOfDirectory(atPath: root).sorted().prefix(count)
    guard names.count == count else { throw SystemError("\(root) has only \(names.count) documents", ENOENT) }
    var descriptors: [Int32] = []
    defer { for fd in descriptors { close(fd) } }
    var buffer = [UInt8](repeating: 0, count: 4096)
    for name in names {
        var path = root + "/" + name
        var st = stat()
        guard stat(path, &st) == 0 else { throw SystemError("stat \(path)") }
        if st.st_mode & S_IFMT == S_IFDIR {
            let children = try FileManager.default.contentsOfDirectory(atPath: path).sorted()
            guard
                let file = children.first(where: { child in
                    var cst = stat()
                    return stat(path + "/" + child, &cst) == 0 && cst.st_mode & S_IFMT == S_IFREG
                })
            else { continue }
            path += "/" + file
        }
        let fd = try openFile(path, O_RDONLY)
        descriptors.append(fd)
        guard buffer.withUnsafeMutableBytes({ read(fd, $0.baseAddress, $0.count) }) >= 0 else {
            throw SystemError("read \(path)")
        }
    }
    return try residentSetSize(of: daemon)
}

/// VmHWM and VmRSS of a process, in KiB.
func residentSetSize(of pid: pid_t) throws -> (hwm: Int, rss: Int) {
    guard let text = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else {
        throw SystemError("read /proc/\(pid)/status", ESRCH)
    }
    func field(_ name: String) -> Int {
        for line in text.split(separator: "\n") where line.hasPrefix(name + ":") {
            return Int(
                line.dropFirst(name.count + 1).split(whereSeparator: { $0 == " " || $0 == "\t" }).first ?? "")
                ?? 0
        }
        return 0
    }
    return (field("VmHWM"), field("VmRSS"))
}

// MARK: - Propagation between two mounts (B8)

/// Whether the file at `path` holds exactly `expected` now: a fresh open, read and close each
/// time, as a user's `cat` would, so the kernel's caches answer whatever they still hold.
private func holds(_ path: String, _ expected: [UInt8]) -> Bool {
    let fd = open(path, O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { return false }
    defer { close(fd) }
    var buffer = [UInt8](repeating: 0, count: expected.count + 1)
    var total = 0
    while total < buffer.count {
        let n = buffer.withUnsafeMutableBytes { raw -> Int in
            guard let base = raw.baseAddress else { return 0 }
            return read(fd, base + total, raw.count - total)
        }
        if n <= 0 { break }
        total += n
    }
    return total == expected.count && buffer[0..<total].elementsEqual(expected)
}

/// Polls `condition` every 2 ms for up to `timeout` seconds: the milliseconds from `start` (a
/// `now()`) until it held.
private func waitFor(since start: UInt64, timeout: Double, _ condition: () -> Bool) throws -> Double {
    while !condition() {
        if seconds(since: start) > timeout { throw SystemError("no change after \(timeout) s", ETIMEDOUT) }
        usleep(2000)
    }
    return seconds(since: start) * 1000
}

/// B8: writes `text` to `writePath` (truncate, write, fsync, close) and measures how long until
/// `readPath`, the same file seen through another mount whose kernel has it cached, reads the
/// new text. Milliseconds from the fsync call, which returns once the save is durable.
func propagateSave(write writePath: String, read readPath: String, text: String) throws -> Double {
    let bytes = Array(text.utf8)
    // Cached on the reading side first: the old contents and attributes are what it must drop.
    _ = holds(readPath, bytes)
    _ = holds(readPath, bytes)
    let fd = try openFile(writePath, O_WRONLY | O_TRUNC)
    try bytes.withUnsafeBytes { try writeAll(fd, $0, path: writePath) }
    let start = now()
    try fsyncChecked(fd, path: writePath)
    try closeChecked(fd, path: writePath)
    return try waitFor(since: start, timeout: 10) { holds(readPath, bytes) }
}

/// B8: creates the document `createPath` (a flat one: create, write, fsync, close) and measures
/// how long until `seenPath`, its name in another mount, which was just looked up and found
/// missing, exists there. Milliseconds from the open(O_CREAT) call, which creates the document.
func propagateCreate(create createPath: String, seen seenPath: String) throws -> Double {
    var st = stat()
    guard lstat(seenPath, &st) != 0 else { throw SystemError("\(seenPath) exists already", EEXIST) }
    let start = now()
    let fd = try openFile(createPath, O_WRONLY | O_CREAT | O_EXCL)
    try Array("new\n".utf8).withUnsafeBytes { try writeAll(fd, $0, path: createPath) }
    try fsyncChecked(fd, path: createPath)
    try closeChecked(fd, path: createPath)
    return try waitFor(since: start, timeout: 10) { lstat(seenPath, &st) == 0 }
}
