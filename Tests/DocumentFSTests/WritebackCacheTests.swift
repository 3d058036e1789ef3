import DocumentEngine
import DocumentFS
import Foundation
import StoreTestSupport
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// The kernel's writeback cache (on by default): the kernel keeps writes, sizes and times, and
/// the mount keeps them right when a file changes elsewhere (a new inode, ``NodeTable/retire``).
@Suite struct WritebackCacheTests {
    @Test(
        "a file that shrinks or grows elsewhere shows its new size and bytes; a descriptor opened before keeps what it opened",
        arguments: StoreKind.all)
    func sizeChangedElsewhere(_ kind: StoreKind) async throws {
        let fixture = try Fixture.small(kind)
        defer { fixture.remove() }
        let other = try Engine(fixture)
        try await withMount(fixture.store) { mount in
            let notes = mount.url("Work.pkg/notes.txt")
            let long = String(repeating: "a long line of the mount's own\n", count: 200)
            // Written through the kernel's cache and saved; the kernel keeps this inode's size.
            try await offThread {
                try writeText(notes, long)
                #expect(try statOf(notes).st_size == long.utf8.count)
            }
            try await expectEventually("the mount's save") { try other.text("Work.pkg", "notes.txt") == long }
            let held = try await offThread { try openFile(notes, O_RDONLY) }
            defer { close(held) }
            // Another process saves `text`; the mount's `stat` and reads show it.
            func savedElsewhere(_ text: String) async throws {
                try other.replaceText("Work.pkg", "notes.txt", with: text)
                let shown = try await waitUntil(timeout: 10) {
                    try statOf(notes).st_size == text.utf8.count && readText(notes) == text
                }
                #expect(shown != nil, "the mount still shows \((try? statOf(notes).st_size) ?? -1) bytes")
            }

            try await savedElsewhere("short\n")
            // The descriptor opened before reads the file as it opened it.
            let (heldSize, heldText) = try await offThread { () -> (Int, String) in
                var st = stat()
                guard fstat(held, &st) == 0 else { throw TestFailure("fstat: \(errno)") }
                var buffer = [UInt8](repeating: 0, count: long.utf8.count + 10)
                let count = pread(held, &buffer, buffer.count, 0)
                return (Int(st.st_size), String(decoding: buffer.prefix(max(count, 0)), as: UTF8.self))
            }
            #expect(heldSize == long.utf8.count)
            #expect(heldText == long)

            let grown = String(repeating: "theirs\n", count: 3000)
            try await savedElsewhere(grown)
            // And the mount writes on top of theirs, from the new size.
            try await offThread {
                let fd = try openFile(notes, O_WRONLY | O_APPEND)
                try writeAll(fd, "ours\n")
                try sys(close(fd), "close")
            }
            try await expectEventually("our append on top of theirs") {
                try other.text("Work.pkg", "notes.txt") == grown + "ours\n"
            }
        }
    }

    @Test(
        "an open for writing only lets the kernel read the page it writes into; appends from two descriptors interleave; the kernel's times are saved",
        arguments: StoreKind.all)
    func kernelOwnsWrites(_ kind: StoreKind) async throws {
        let fixture = try Fixture.small(kind)
        defer { fixture.remove() }
        let other = try Engine(fixture)
        try await withMount(fixture.store) { mount in
            let notes = mount.url("Work.pkg/notes.txt")
            let alphabet = "abcdefghijklmnopqrstuvwxyz\n"
            let written = try await offThread { () -> stat in
                try writeText(notes, alphabet)
                // Write-only, three bytes inside the first page: the kernel reads the page first.
                let fd = try openFile(notes, O_WRONLY)
                #expect(Array("XYZ".utf8).withUnsafeBytes { pwrite(fd, $0.baseAddress, 3, 5) } == 3)
                try sys(close(fd), "close")
                let first = try openFile(notes, O_WRONLY | O_APPEND)
                let second = try openFile(notes, O_WRONLY | O_APPEND)
                try writeAll(first, "1\n")
                try writeAll(second, "2\n")
                try writeAll(first, "3\n")
                try sys(fsync(second), "fsync")
                try sys(close(first), "close")
                try sys(close(second), "close")
                return try statOf(notes)
            }
            let expected = "abcdeXYZijklmnopqrstuvwxyz\n1\n2\n3\n"
            #expect(try readText(notes) == expected)
            try await expectEventually("the saved text") {
                try other.text("Work.pkg", "notes.txt") == expected
            }
            // The kernel kept the times of the writes and sent them with its pages.
            let record = try #require(try other.record("Work.pkg", "notes.txt"))
            #expect(FileTime(record.modified) == FileTime(written.st_mtim))
            #expect(written.st_size == expected.utf8.count)
        }
    }

    @Test(
        "close-to-open: an open right after another process's save, before the mount has heard of it, reads the new size and bytes",
        arguments: StoreKind.all)
    func openRevalidatesSize(_ kind: StoreKind) async throws {
        let fixture = try Fixture.small(kind)
        defer { fixture.remove() }
        let other = try Engine(fixture)
        // The observer is slowed down so that only the open's revalidation can see the save.
        try await withMount(fixture.store, configure: { $0.fileSystem.pollInterval = .seconds(600) }) {
            mount in
            let notes = mount.url("Work.pkg/notes.txt")
            try await offThread { () throws in
                #expect(try readText(notes) == Fixture.notesText)
                #expect(try statOf(notes).st_size == Fixture.notesText.utf8.count)
            }
            for text in ["a good deal longer than it was before\n", "tiny\n"] {
                try other.replaceText("Work.pkg", "notes.txt", with: text)
                try await offThread { () throws in
                    #expect(try readText(notes) == text)
                    #expect(try statOf(notes).st_size == text.utf8.count)
                }
            }
        }
    }
}
