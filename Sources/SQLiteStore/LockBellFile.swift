import Foundation
import Synchronization
import Threading
import VersionedStore

#if canImport(Glibc)
    import Glibc
#endif

/// News of lock releases between the processes that open one store file, without polling: a
/// process that released a lock writes a byte to `<store>-locks` after its commit, and every
/// process that waits for a lock watches the store's folder for that file's changes (inotify).
final class LockBellFile: Sendable {
    let path: String
    private let bell = LockBell()
    private let watcher = Mutex<Watcher?>(nil)

    /// The watching thread's stop flag, which it checks every second: the thread holds this,
    /// not the store, so a closed store's watcher ends.
    private final class Watcher: Sendable {
        let stopped = Atomic(false)
    }

    init(storePath: String) { path = storePath + "-locks" }

    deinit { watcher.withLock { $0?.stopped.store(true, ordering: .releasing) } }

    /// Tells this process's waiters at once, and the others through the file.
    func ring() {
        bell.ring()
        let fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0o644)
        guard fd >= 0 else { return }
        var byte: UInt8 = 1
        _ = pwrite(fd, &byte, 1, 0)
        close(fd)
    }

    var generation: UInt64 {
        startWatching()
        return bell.current
    }

    func wait(after generation: UInt64, timeout: Duration) -> UInt64 {
        startWatching()
        return bell.wait(after: generation, timeout: timeout)
    }

    private func startWatching() {
        let started = watcher.withLock { watcher -> Watcher? in
            guard watcher == nil else { return nil }
            let made = Watcher()
            watcher = made
            return made
        }
        guard let started else { return }
        let folder = (path as NSString).deletingLastPathComponent
        let name = (path as NSString).lastPathComponent
        let bell = bell
        let launched = startDetachedThread(name: "docfs.lock-bell") {
            Self.watch(
                folder: folder.isEmpty ? "." : folder, name: name, bell: bell, stopped: started.stopped)
        }
        if !launched { watcher.withLock { $0 = nil } }
    }

    /// Rings `bell` whenever `name` in `folder` is written, until `stopped`. Without inotify (a
    /// file system that has none), it rings every quarter of a second instead.
    private static func watch(folder: String, name: String, bell: LockBell, stopped: borrowing Atomic<Bool>) {
        let fd = inotify_init1(Int32(IN_CLOEXEC))
        let watch =
            fd >= 0
            ? inotify_add_watch(fd, folder, UInt32(IN_MODIFY | IN_CLOSE_WRITE | IN_CREATE | IN_MOVED_TO)) : -1
        defer { if fd >= 0 { close(fd) } }
        // Releases before the watch began were not seen.
        bell.ring()
        var buffer = [UInt8](repeating: 0, count: 4096)
        while !stopped.load(ordering: .acquiring) {
            guard watch >= 0 else {
                usleep(250_000)
                bell.ring()
                continue
            }
            var poller = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            let ready = poll(&poller, 1, 1000)
            guard ready > 0 else { continue }
            let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            guard count > 0 else { continue }
            var offset = 0
            var rang = false
            buffer.withUnsafeBytes { raw in
                while offset + MemoryLayout<inotify_event>.size <= count {
                    let length = Int(raw.load(fromByteOffset: offset + 12, as: UInt32.self))
                    let start = offset + MemoryLayout<inotify_event>.size
                    if length > 0, start + length <= count {
                        let bytes = raw[start..<start + length].prefix { $0 != 0 }
                        if !rang, String(decoding: bytes, as: UTF8.self) == name {
                            bell.ring()
                            rang = true
                        }
                    }
                    offset = start + length
                }
            }
        }
    }
}
