import DocumentEngine
import DocumentFS
import Foundation
import StoreTestSupport
import TestSupport
import Testing
import VersionedStore

#if canImport(Glibc)
    import Glibc
#endif

/// A new file written in order is cut, hashed and stored while it is written
/// (`ContentsPreparation`), and its save takes that work: the bytes stored must be the file's
/// whatever the writer does after (rewrites, truncations, holes), through a real mount, on both
/// stores.
@Suite struct PreparedWriteTests {
    static let mebibyte = 1 << 20

    init() {
        // The whole suite keeps both cores busy: an idle-priority step could wait seconds.
        VersionedStore.preparesAtNormalPriority()
    }

    /// `count` megabytes of deterministic bytes, different in every 8 bytes.
    static func contents(megabytes count: Int, seed: UInt64) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: count * mebibyte)
        var x = seed | 1
        bytes.withUnsafeMutableBytes { raw in
            for i in stride(from: 0, to: raw.count, by: 8) {
                x ^= x << 13
                x ^= x >> 7
                x ^= x << 17
                raw.storeBytes(of: x, toByteOffset: i, as: UInt64.self)
            }
        }
        return bytes
    }

    enum Twist: String, CaseIterable, CustomTestStringConvertible, Sendable {
        /// Written in order, then fsync.
        case none
        /// A few bytes near the start written again after 20 MiB.
        case rewrite
        /// Cut back to 12 MiB after 20 MiB, then written on.
        case truncate
        /// A hole of 3 MiB after 20 MiB (a seek past the end), then written on.
        case hole
        /// Closed without fsync: the mount's own save (a group commit) takes the work.
        case close
        var testDescription: String { rawValue }
    }

    /// Writes 32 MiB in 1 MiB writes with `twist` after 20 MiB, calling `prepared` before it
    /// and before the end; returns the file's bytes.
    static func write(_ fd: Int32, _ twist: Twist, prepared: () throws -> Void) throws -> [UInt8] {
        let source = contents(megabytes: 32, seed: 0x5EED)
        var expected: [UInt8] = []
        var offset = 0
        for index in 0..<32 {
            let block = Array(source[index * mebibyte..<(index + 1) * mebibyte])
            let n = block.withUnsafeBytes { Glibc.pwrite(fd, $0.baseAddress, $0.count, off_t(offset)) }
            guard n == mebibyte else { throw TestFailure("pwrite: \(errno)") }
            if expected.count < offset { expected += [UInt8](repeating: 0, count: offset - expected.count) }
            expected.replaceSubrange(offset..<min(expected.count, offset + mebibyte), with: block)
            offset += mebibyte
            guard index == 19 else { continue }
            // The preparation has read past the twist's bytes.
            try prepared()
            switch twist {
            case .rewrite:
                let patch = [UInt8](repeating: 0x58, count: 5000)
                let at = 3 * mebibyte + 123
                _ = patch.withUnsafeBytes { Glibc.pwrite(fd, $0.baseAddress, $0.count, off_t(at)) }
                expected.replaceSubrange(at..<at + patch.count, with: patch)
            case .truncate:
                guard ftruncate(fd, off_t(12 * mebibyte)) == 0 else {
                    throw TestFailure("ftruncate: \(errno)")
                }
                expected.removeSubrange((12 * mebibyte)...)
                offset = 12 * mebibyte
            case .hole:
                offset += 3 * mebibyte
            case .none, .close:
                break
            }
        }
        try prepared()
        return expected
    }

    /// Writes the file through a mount and checks what the store holds after the unmount.
    func check(_ kind: StoreKind, _ twist: Twist, writebackCache: Bool) async throws {
        let fixture = try await Fixture.make(kind)
        defer { fixture.remove() }
        let store = fixture.store
        let before = store.statistics.bytesPrepared
        let expected = try await withMount(
            store,
            configure: {
                $0.fileSystem.writebackCache = writebackCache
                // No save of the open file while the test waits for the preparation: a saved
                // file's later writes are edits of stored bytes, which nothing prepares.
                $0.fileSystem.quietInterval = .seconds(600)
            }
        ) { mount in
            let path = mount.url("Project.pkg/stream.bin")
            return try await offThread { () throws -> [UInt8] in
                let fd = Glibc.open(path, O_RDWR | O_CREAT | O_TRUNC, 0o644)
                guard fd >= 0 else { throw TestFailure("open: \(errno)") }
                defer { Glibc.close(fd) }
                var waited = Int64(0)
                let expected = try Self.write(fd, twist) {
                    // The kernel's cached pages go to the mount now (no fsync: not a save);
                    // then the preparation reads at least 8 MiB more of them.
                    _ = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)
                    waited += 8 << 20
                    let target = waited
                    guard
                        eventually(timeout: 30, { store.statistics.bytesPrepared - before >= target }) != nil
                    else {
                        throw TestFailure(
                            "the preparation read \(store.statistics.bytesPrepared - before) bytes")
                    }
                }
                if twist != .close { guard fsync(fd) == 0 else { throw TestFailure("fsync: \(errno)") } }
                return expected
            }
        }
        // The mount is gone: whatever it acknowledged is in the store.
        let record = try fixture.record("Project.pkg", "stream.bin")
        #expect(record.size == Int64(expected.count))
        let stored = [UInt8](
            try fixture.reopen().readContents(of: record.id, at: nil, offset: 0, count: expected.count))
        #expect(stored.count == expected.count)
        if let first = stored.indices.first(where: { $0 < expected.count && stored[$0] != expected[$0] }) {
            Issue.record("the stored bytes differ first at \(first)")
        }
        let report = try store.checkIntegrity()
        #expect(report.isClean, "\(report.problems)")
    }

    /// Every twist on SQLite, through the mount without the writeback cache (each write(2)
    /// reaches the mount in order) and with it; the mount's part is the same on PostgreSQL, whose
    /// storing of the prepared chunks `PreparedContentsTests` covers.
    static let cases: [(StoreKind, Twist, writebackCache: Bool)] =
        Twist.allCases.map { (.sqlite, $0, false) } + [(.sqlite, .none, true), (.sqlite, .rewrite, true)]
        + (StoreKind.all.contains(.postgres) ? [(.postgres, .none, true), (.postgres, .close, false)] : [])

    @Test(
        "a new file written in order is stored while it is written; the save takes it, whatever the writer does after",
        arguments: cases)
    func preparedWrite(_ kind: StoreKind, _ twist: Twist, writebackCache: Bool) async throws {
        try await check(kind, twist, writebackCache: writebackCache)
    }
}
