import DocumentEngine
import DocumentFS
import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// The test mounts' watchdog (Support.swift): a mount a test holds past its deadline is aborted,
/// so a syscall stuck on it returns instead of hanging the suite.
@Suite(.serialized)
struct MountWatchdogTests {
    @Test("a read stuck in the file system returns once the watchdog aborts the connection")
    func abortsAStuckMount() async throws {
        let fixture = try Fixture.small()
        defer { fixture.remove() }
        let proxy = ProxyStore(fixture.store)
        // The deadline runs from the mount's creation.
        let start = Date()
        let mount = try TestMount(proxy, deadline: .seconds(1))
        #expect(mount.watchdog.connection != nil)
        proxy.holdReadsOfContents()
        let path = mount.url("Work.pkg/notes.txt")
        // Never answered: the store holds every read of contents. The time is taken on the
        // blocked thread itself: resuming the test can wait for a busy cooperative pool.
        let (stuck, waited) = try await offThread { () -> (Int32, Double) in
            let fd = open(path, O_RDONLY | O_CLOEXEC)
            if fd < 0 { return (errno, Date().timeIntervalSince(start)) }
            defer { close(fd) }  // once: nothing else closes it
            var buffer = [UInt8](repeating: 0, count: 16)
            let result = read(fd, &buffer, 16) < 0 ? errno : 0
            return (result, Date().timeIntervalSince(start))
        }
        #expect(stuck == ECONNABORTED || stuck == ENOTCONN, "errno \(stuck)")
        #expect(waited >= 0.9 && waited < 15, "returned after \(waited) s")
        #expect(proxy.waitingReads == 1)
        #expect(mount.watchdog.fired != nil)
        // Every request on the aborted mount fails now, at once (statfs is never cached).
        let after = try await offThread { () -> Int32 in
            var st = statvfs()
            return errnoOf(statvfs(mount.path, &st))
        }
        #expect(after == ENOTCONN)
        proxy.releaseReads()
        mount.close(expectingWatchdog: true)
        #expect(!isMounted(mount.path))
    }

    @Test("a mount closed before its deadline is left alone")
    func quietWhenClosedInTime() async throws {
        let fixture = try Fixture.small()
        defer { fixture.remove() }
        // Generous: a loaded machine can take seconds to mount, list and unmount.
        let started = Date()
        let mount = try TestMount(fixture.store, deadline: .seconds(6))
        let listed = try await offThread { try entries(in: mount.path) }
        #expect(listed == ["Flat.txt", "Other.pkg", "Work.pkg"])
        mount.close()
        let pastDeadline = max(0, 6.5 - Date().timeIntervalSince(started))
        _ = try await offThread { usleep(UInt32(pastDeadline * 1_000_000)) }
        #expect(mount.watchdog.fired == nil)
    }

    @Test("child processes run under timeout: a hung child is killed")
    func childrenTimeOut() async throws {
        // Timed on the thread that waits for the child: the test's own task may wait long for a
        // free cooperative thread on a loaded machine, which says nothing about the timeout.
        let (result, took) = try await offThread { () throws -> (ProcessResult, TimeInterval) in
            let start = Date()
            let result = try runTimed("/bin/sleep", ["30"], seconds: 1)
            return (result, Date().timeIntervalSince(start))
        }
        #expect(result.status == 124)
        #expect(took < 10)
    }
}
