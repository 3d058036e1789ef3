// A micro-benchmark of the FUSE layer: a no-op filesystem mounted in a temporary directory,
// timed from this process through real syscalls.
//
// A hand-written timing loop on purpose: a benchmark library is too heavy to build in CI for
// two numbers. Each figure is the median (and min–max) of several rounds.

import FUSE
import Foundation
import Synchronization
import SystemPackage
import Threading

#if canImport(Glibc)
    import Glibc
#endif

/// Serves one file of `fileSize` zero bytes; nothing else. Attributes are never cached
/// (timeout 0) and the file is opened with direct I/O, so every stat and read reaches here.
final class NoopFS: FileSystem {
    static let fileSize = 1 << 20
    static let zeros = [UInt8](repeating: 0, count: fileSize)
    let root = FileAttributes(
        ino: 1, type: .directory, permissions: FilePermissions(rawValue: 0o755), nlink: 2)
    let file = FileAttributes(
        ino: 2, type: .regular, permissions: FilePermissions(rawValue: 0o644), size: UInt64(fileSize))

    func initialize(_ config: inout KernelConfig) {
        try? config.setMaxWrite(config.maxWriteLimit)
    }

    func lookup(_ context: RequestContext, parent: NodeID, name: FileName, reply: consuming ReplyEntry) {
        // A name that is not there, never cached: every stat of it is one LOOKUP.
        guard parent == .root, name == "file" else { return reply.negative(timeout: .zero) }
        reply.entry(
            Entry(node: NodeID(2), attributes: file, attributeTimeout: .zero, entryTimeout: .seconds(60)))
    }

    func getattr(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle?, reply: consuming ReplyAttr
    ) {
        reply.attributes(node == .root ? root : file, timeout: .zero)
    }

    func open(_ context: RequestContext, node: NodeID, flags: OpenFlags, reply: consuming ReplyOpen) {
        reply.opened(FUSE.FileHandle(1), options: [.directIO])
    }

    func read(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle, offset: UInt64, size: Int,
        reply: consuming ReplyData
    ) {
        let start = min(Int(offset), Self.fileSize)
        let end = min(start + size, Self.fileSize)
        reply.data(Self.zeros[start..<end])
    }
}

func now() -> UInt64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return UInt64(ts.tv_sec) * 1_000_000_000 + UInt64(ts.tv_nsec)
}

struct Stats {
    var median: Double
    var min: Double
    var max: Double
    init(_ samples: [Double]) {
        let sorted = samples.sorted()
        median = sorted[sorted.count / 2]
        min = sorted.first ?? 0
        max = sorted.last ?? 0
    }
}

/// Runs `body` `iterations` times per round and returns the per-iteration time in µs.
func measure(rounds: Int, iterations: Int, _ body: () throws -> Void) rethrows -> Stats {
    for _ in 0..<max(1, iterations / 10) { try body() }  // warm up
    var samples: [Double] = []
    for _ in 0..<rounds {
        let start = now()
        for _ in 0..<iterations { try body() }
        samples.append(Double(now() - start) / Double(iterations) / 1000)
    }
    return Stats(samples)
}

/// Requests per second of `threads` threads each running `body` for about `seconds`; the median
/// of `rounds` rounds.
func throughput(threads: Int, rounds: Int, seconds: Double = 0.5, _ body: @escaping @Sendable () -> Void)
    -> Stats
{
    var samples: [Double] = []
    for _ in 0..<rounds {
        let done = Atomic<Int>(0)
        let deadline = now() + UInt64(seconds * 1e9)
        let start = now()
        let group = WorkCount()
        for _ in 0..<threads {
            group.enter()
            startDetachedThread(name: "bench") {
                var count = 0
                while now() < deadline {
                    for _ in 0..<64 { body() }
                    count += 64
                }
                done.add(count, ordering: .relaxed)
                group.leave()
            }
        }
        group.wait()
        samples.append(Double(done.load(ordering: .relaxed)) / (Double(now() - start) / 1e9))
    }
    return Stats(samples)
}

func main() throws {
    let arguments = CommandLine.arguments
    let rounds = arguments.count > 1 ? Int(arguments[1]) ?? 7 : 7
    var template = Array("/tmp/fusebench.XXXXXX".utf8CString)
    guard let dir = mkdtemp(&template) else { throw Errno(rawValue: errno) }
    let mountpoint = String(cString: dir)
    defer { rmdir(mountpoint) }
    var options = MountOptions()
    options.fsName = "fusebench"
    options.subtype = "fusebench"
    let session = try Session(filesystem: NoopFS(), mountpoint: mountpoint, options: options)
    try session.start()
    defer { session.unmount() }
    let path = mountpoint + "/file"

    var st = stat()
    guard stat(path, &st) == 0, st.st_size == NoopFS.fileSize else { throw Errno(rawValue: errno) }
    let getattr = measure(rounds: rounds, iterations: 2000) {
        _ = stat(path, &st)
    }

    let fd = try FileDescriptor.open(path, .readOnly)
    defer { try? fd.close() }
    var buffer = [UInt8](repeating: 1, count: NoopFS.fileSize)
    let read = try measure(rounds: rounds, iterations: 50) {
        var done = 0
        while done < NoopFS.fileSize {
            let n = try buffer.withUnsafeMutableBytes {
                try fd.read(
                    fromAbsoluteOffset: Int64(done),
                    into: UnsafeMutableRawBufferPointer(rebasing: $0[done...]))
            }
            if n == 0 { break }
            done += n
        }
        guard done == NoopFS.fileSize else { throw Errno.ioError }
    }
    let mibPerSecond = 1_000_000 / read.median

    let missing = mountpoint + "/missing"
    var rates: [(String, Stats)] = []
    for threads in [1, 2] {
        rates.append(
            (
                "getattr_\(threads)t",
                throughput(threads: threads, rounds: rounds) {
                    var st = stat()
                    _ = stat(path, &st)
                }
            ))
        rates.append(
            (
                "lookup_\(threads)t",
                throughput(threads: threads, rounds: rounds) {
                    var st = stat()
                    _ = stat(missing, &st)
                }
            ))
    }

    func f(_ x: Double) -> String { String(format: "%.1f", x) }
    for (name, rate) in rates {
        print(
            "\(name.padding(toLength: 12, withPad: " ", startingAt: 0)) requests/s: median \(Int(rate.median)) (\(Int(rate.min))–\(Int(rate.max)))"
        )
    }
    print(
        "no-op getattr (stat, attr timeout 0): median \(f(getattr.median)) µs (\(f(getattr.min))–\(f(getattr.max))), \(rounds) rounds × 2000"
    )
    print(
        "1 MiB read (direct_io):                median \(f(read.median)) µs (\(f(read.min))–\(f(read.max))), \(f(mibPerSecond)) MiB/s, \(rounds) rounds × 50"
    )
    print(
        "{\"getattr_us\":{\"median\":\(f(getattr.median)),\"min\":\(f(getattr.min)),\"max\":\(f(getattr.max))},"
            + "\"read_1mib_us\":{\"median\":\(f(read.median)),\"min\":\(f(read.min)),\"max\":\(f(read.max))},"
            + "\"read_mib_per_s\":\(f(mibPerSecond)),"
            + rates.map { "\"\($0.0)_per_s\":\(Int($0.1.median))," }.joined() + "\"rounds\":\(rounds)}")
}

do {
    try main()
} catch {
    FileHandle.standardError.write("fuse-bench: \(error)\n".data(using: .utf8) ?? Data())
    exit(1)
}
