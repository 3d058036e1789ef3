import DocumentEngine
import DocumentFS
import Foundation
import StoreTestSupport
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Every version a mount saves is a state its files had, and the Trash keeps what was moved
/// there: what the power-loss suite (scripts/power-loss.sh) found wrong once, tried directly.
@Suite(.serialized)
struct SaveConsistencyTests {
    /// With the writeback cache, `ftruncate` after a write sends the size before the pages: the
    /// mount reads zeros below it until the kernel writes them back. Another file's fsync saves
    /// the package meanwhile; no version may hold those zeros.
    @Test(
        "a file written and then ftruncated is never saved as zeros by another file's fsync",
        arguments: StoreKind.all)
    func sizeAheadOfThePages(_ kind: StoreKind) async throws {
        let fixture = try Fixture.small(kind)
        let engine = try Engine(fixture)
        try await withMount(fixture.store) { mount in
            let big = mount.url("Work.pkg/big.bin")
            let other = mount.url("Work.pkg/other.txt")
            let bytes = [UInt8](repeating: 0x78, count: 200_000)
            try await offThread {
                let file = try OpenedFile(big, O_CREAT | O_WRONLY, 0o644)
                try pwriteAll(file.fd, bytes, at: 0)
                _ = try sys(ftruncate(file.fd, off_t(bytes.count)))
                // Past the quiet interval, then a save of the package by another file's fsync.
                usleep(1_600_000)
                let neighbour = try OpenedFile(other, O_CREAT | O_WRONLY | O_TRUNC, 0o644)
                try writeAll(neighbour.fd, "other\n")
                _ = try sys(fsync(neighbour.fd))
                neighbour.close()
                file.close()
            }
            mount.mount.fileSystem.saveAll(durable: true)
        }
        #expect(try engine.contents("Work.pkg", "big.bin") == Data(repeating: 0x78, count: 200_000))
        for version in try engine.versions("Work.pkg") {
            guard let data = try engine.contents("Work.pkg", "big.bin", at: version.id), !data.isEmpty else {
                continue
            }
            #expect(
                data == Data(repeating: 0x78, count: 200_000), "version \(version.id) holds \(data.prefix(8))"
            )
        }
    }

    @Test(
        "a hard link moved to the Trash keeps the bytes last written through either name, after a remount too",
        arguments: StoreKind.all)
    func hardLinkInTheTrash(_ kind: StoreKind) async throws {
        let fixture = try Fixture.small(kind)
        let trashed = "/.Trash-\(getuid())/files/T-link"
        try await withMount(fixture.store) { mount in
            let a = mount.url("Work.pkg/a.txt")
            let link = mount.url("Work.pkg/l.txt")
            try await offThread {
                try writeText(a, "old\n")
                _ = try sys(Glibc.link(a, link))
                for (path, text) in [(link, "mid\n"), (a, "new\n")] {
                    let file = try OpenedFile(path, O_WRONLY)
                    try pwriteAll(file.fd, Array(text.utf8), at: 0)
                    _ = try sys(fsync(file.fd))
                    file.close()
                }
                _ = try sys(rename(link, mount.path + trashed))
            }
            let shown = try readText(mount.path + trashed)
            #expect(shown == "new\n")
        }
        try await withMount(fixture.store) { mount in
            let shown = try readText(mount.path + trashed)
            #expect(shown == "new\n", "after a remount")
        }
    }

    @Test(
        "a document moved to the Trash reads through its new name again and again", arguments: StoreKind.all)
    func documentReadAfterTheMove(_ kind: StoreKind) async throws {
        let fixture = try Fixture.small(kind)
        try await withMount(fixture.store) { mount in
            let trashed = mount.path + "/.Trash-\(getuid())/files/T-flat"
            try await offThread {
                _ = try sys(rename(mount.url("Flat.txt"), trashed))
                for _ in 0..<3 { #expect(try readText(trashed) == Fixture.flatText) }
            }
        }
    }
}
