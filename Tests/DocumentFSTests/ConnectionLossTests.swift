import DocumentEngine
import DocumentFS
import Foundation
import StoreTestSupport
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// A mount of a PostgreSQL store whose server goes away and comes back (this test's database
/// refuses connections and its connections are closed, as in a server restart or a network cut).
@Suite(.enabled(if: StoreKind.postgresURL != nil))
struct ConnectionLossTests {
    /// What an append and fsync through the mount gave: each call's errno (0 for success).
    struct Outcome: Equatable, Sendable {
        var write: Int32
        var fsync: Int32
        var close: Int32
        /// Whether the change was acknowledged as durable.
        var acknowledged: Bool { write == 0 && fsync == 0 }
    }

    static func appendAndSync(_ path: String, _ text: String) throws -> Outcome {
        let fd = try openFile(path, O_WRONLY | O_APPEND)
        let bytes = Array(text.utf8)
        let written = Glibc.write(fd, bytes, bytes.count) == bytes.count ? 0 : errno
        let synced = written == 0 ? (fsync(fd) == 0 ? 0 : errno) : -1
        let closed = close(fd) == 0 ? 0 : errno
        return Outcome(write: written, fsync: synced, close: closed)
    }

    @Test(
        "server gone: the mount serves what it read, fsync fails with EIO; server back: the change is saved")
    func serverGoneAndBack() async throws {
        let fixture = try Fixture.small(.postgres)
        try await withMount(fixture.store) { mount in
            let notes = mount.url("Work.pkg/notes.txt")
            let flat = mount.url("Flat.txt")
            let before = try await offThread { [try readText(notes), try readText(flat)] }
            #expect(before == [Fixture.notesText, Fixture.flatText])

            let clock = ContinuousClock.now
            try fixture.stores.cutConnections()
            var lost = true
            defer { if lost { try? fixture.stores.allowConnections() } }
            let during = try await offThread { () -> (String, String?, Outcome) in
                // What the mount has read it still serves, even once the kernel dropped its pages
                // (the daemon reads it from the store's memory then).
                let fd = try openFile(notes, O_RDONLY)
                _ = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)
                close(fd)
                let cachedNotes: String
                do { cachedNotes = try readText(notes) } catch { cachedNotes = "\(error)" }
                let cachedListing = try? entries(in: mount.url("Work.pkg")).joined(separator: ",")
                // A change it cannot save is not acknowledged.
                return (cachedNotes, cachedListing, try Self.appendAndSync(flat, "during\n"))
            }
            print("connection loss: the outage's reads and write took \(ContinuousClock.now - clock)")
            #expect(during.0 == Fixture.notesText, "a file read before is served")
            #expect(during.1 != nil, "a folder listed before is listed")
            // The append needs the file's last chunk, which is not cached: the write itself may
            // fail; if it is taken in, fsync must fail. Either way with EIO, never a success.
            #expect(!during.2.acknowledged, "a change made without the server was acknowledged: \(during.2)")
            #expect(during.2.write == EIO || during.2.fsync == EIO, "\(during.2)")

            try fixture.stores.allowConnections()
            lost = false
            let resumed = ContinuousClock.now
            let after = try await offThread { try Self.appendAndSync(flat, "after\n") }
            print("connection loss: the first write and fsync after it took \(ContinuousClock.now - resumed)")
            #expect(after == Outcome(write: 0, fsync: 0, close: 0))
            let other = try fixture.reopen()
            let info = try #require(try other.document(named: "Flat.txt"))
            let size = try #require(try other.node(info.root)).size
            let stored = String(
                decoding: try other.readContents(of: info.root, at: nil, offset: 0, count: Int(size)),
                as: UTF8.self)
            // A write taken in during the outage is saved with the next one; a refused one is not.
            let expected = Fixture.flatText + (during.2.write == 0 ? "during\n" : "") + "after\n"
            #expect(stored == expected)
        }
    }
}
