import DocumentFS
import Foundation
import StoreTestSupport
import Synchronization
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// A file another mount keeps rewriting opens and reads normally: never `ESTALE`, never a torn
/// version. With the writeback cache a file changed elsewhere gets a new kernel inode, and the
/// kernel may still open the old one.
@Suite("stale handles", .serialized)
struct StaleHandleTests {
    /// The texts the writer writes: all one length, so an in-place rewrite changes bytes only.
    static func text(_ n: Int) -> String { "version \(String(format: "%08d", n))\n" }

    @Test(
        "a reader on one mount while another mount rewrites the file in place: no ESTALE, whole versions",
        arguments: StoreKind.all)
    func readerBesideARewriter(_ kind: StoreKind) async throws {
        let places = [("Work.pkg/notes.txt", "in a package"), ("Flat.txt", "at the root")]
        let outcomes = try await Self.raceOnTwoMounts(kind, paths: places.map(\.0))
        for ((_, name), outcome) in zip(places, outcomes) {
            #expect(outcome.stale == 0, "ESTALE \(name): \(outcome)")
            #expect(outcome.failures.isEmpty, "\(name): \(outcome)")
            #expect(outcome.torn.isEmpty, "\(name): \(outcome)")
            #expect(outcome.writes > 10, "\(name): the writer hardly ran: \(outcome)")
        }
    }

    @Test(
        "a reader on one mount while another mount rewrites the file with other sizes: no ESTALE, whole versions",
        arguments: StoreKind.all)
    func readerBesideAResizer(_ kind: StoreKind) async throws {
        let outcomes = try await Self.raceOnTwoMounts(kind, paths: ["Work.pkg/notes.txt"], resizing: true)
        for outcome in outcomes {
            #expect(outcome.failures.isEmpty, "\(outcome)")
            #expect(outcome.torn.isEmpty, "\(outcome)")
            // The kernel's inode keeps its size under the writeback cache, and the kernel
            // retries an open that answered ESTALE only once: that retry is opened for direct
            // I/O when the file changed again in between.
            #expect(outcome.stale == 0, "\(outcome)")
        }
    }

    /// Two mounts of one store: for each of `paths`, the first mount writes the first version,
    /// the second sees it, then the first rewrites it while the second reads it (``race``).
    static func raceOnTwoMounts(_ kind: StoreKind, paths: [String], resizing: Bool = false) async throws
        -> [Outcome]
    {
        let fixture = try Fixture.small(kind)
        defer { fixture.remove() }
        return try await withMount(fixture.store) { first in
            try await withMount(try fixture.reopen()) { second in
                var outcomes: [Outcome] = []
                for path in paths {
                    try await offThread { try writeText(first.url(path), Self.text(0)) }
                    try await expectEventually("the second mount sees the first version", timeout: 10) {
                        (try? readText(second.url(path))) == Self.text(0)
                    }
                    outcomes.append(
                        try await race(
                            writing: first.url(path), reading: second.url(path), reads: 300,
                            resizing: resizing))
                }
                return outcomes
            }
        }
    }

    struct Outcome: Sendable, CustomStringConvertible {
        var writes = 0
        var stale = 0
        var failures: [String] = []
        var torn: [String] = []
        var description: String {
            "\(writes) writes, \(stale) ESTALE, failures \(failures.prefix(3)), torn \(torn.prefix(3))"
        }
    }

    /// Rewrites `writing` in place (open, pwrite at 0, close) until `reads` opens and reads of
    /// `reading` are done, and counts what the reads met.
    /// With `resizing`, every other version is longer by a few bytes (and the file is cut to it).
    static func race(writing: String, reading: String, reads: Int, resizing: Bool = false) async throws
        -> Outcome
    {
        let stop = StopFlag()
        let writer = Background { () -> Int in
            var n = 1
            while !stop.isSet {
                let fd = open(writing, O_WRONLY)
                guard fd >= 0 else { throw POSIXError(.init(rawValue: errno) ?? .EIO) }
                let bytes = Array((text(n) + (resizing && n % 2 == 1 ? "more\n" : "")).utf8)
                let written = bytes.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, 0) }
                if resizing { ftruncate(fd, off_t(bytes.count)) }
                close(fd)
                guard written == bytes.count else { throw POSIXError(.init(rawValue: errno) ?? .EIO) }
                n += 1
                usleep(2_000)
            }
            return n - 1
        }
        var outcome = try await offThread { () -> Outcome in
            var outcome = Outcome()
            let lengths: Set<Int> = [text(0).utf8.count, text(0).utf8.count + 5]
            for _ in 0..<reads {
                let fd = open(reading, O_RDONLY)
                if fd < 0 {
                    if errno == ESTALE {
                        outcome.stale += 1
                    } else {
                        outcome.failures.append("open: errno \(errno)")
                    }
                    continue
                }
                var buffer = [UInt8](repeating: 0, count: 4096)
                let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
                let failure = errno
                close(fd)
                if n < 0 {
                    if failure == ESTALE {
                        outcome.stale += 1
                    } else {
                        outcome.failures.append("read: errno \(failure)")
                    }
                    continue
                }
                let shown = String(decoding: buffer[..<n], as: UTF8.self)
                if !lengths.contains(n) || !shown.hasPrefix("version ") || !shown.hasSuffix("\n") {
                    outcome.torn.append(shown)
                }
                usleep(1_000)
            }
            return outcome
        }
        stop.set()
        outcome.writes = try await writer.value
        return outcome
    }
}

/// A flag one thread sets and another reads.
final class StopFlag: Sendable {
    private let flag = Atomic<Bool>(false)
    var isSet: Bool { flag.load(ordering: .relaxed) }
    func set() { flag.store(true, ordering: .relaxed) }
}
