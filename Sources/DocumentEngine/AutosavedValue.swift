import Dispatch
import Foundation
import Logging
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// A Codable value that reads itself from a file on first use and writes itself back after every
/// change: the seeds' `OCSAutosavedMutableArray`, for any value.
///
/// - The file is not touched until the first access (read or write). A missing file yields the
///   default value. A file that cannot be decoded is renamed `<name>.corrupt-<timestamp>` (never
///   overwritten); ``load()`` throws ``AutosavedValueError/corruptFile(_:preservedAt:underlying:)``
///   once, while ``value`` logs a warning and carries on with the default value.
/// - Every change is saved atomically (a temporary file in the same folder, `fsync`, `rename`,
///   mode 0600), ``SavePolicy/immediately`` or ``SavePolicy/coalesced(after:)``: all the changes
///   made within the delay after the first unsaved one cost one write.
/// - Pending changes are saved by ``flush()``, on deinit, and by ``flushAll()`` for every live
///   instance; ``installExitHandlers(signals:)`` runs `flushAll` at exit and on SIGTERM/SIGINT.
///
/// Property lists (binary by default) need an array or a dictionary at the top level; use
/// ``Format/json`` for a bare scalar. Instances are thread-safe.
public final class AutosavedValue<Value: Codable & Sendable>: Sendable {
    /// When a change is written.
    public enum SavePolicy: Sendable, Equatable {
        /// In the call that made the change.
        case immediately
        /// Once, `delay` after the first change not yet saved.
        case coalesced(after: Duration)
    }

    /// The file's encoding.
    public enum Format: Sendable, Equatable {
        case binaryPropertyList, xmlPropertyList, json
    }

    /// Where the value is stored.
    public let fileURL: URL
    public let savePolicy: SavePolicy
    public let format: Format
    private let defaultValue: Value
    private let scheduler: any AutosaveScheduler

    /// Everything that changes after init; `modify`'s body runs with it locked.
    private struct State {
        var loaded: Value?
        var pendingLoadError: AutosavedValueError?
        var generation = 0
        var savedGeneration = 0
        var saveScheduled = false
        var writes = 0
        var lastError: (any Error)?
    }

    private let state = Mutex(State())
    /// Held for a whole save, so writes land in the order of the changes they carry. Taken
    /// before `state`, never while holding it.
    private let ioLock = Mutex(())

    /// A value stored at `fileURL`, `defaultValue` until the file exists.
    public init(
        fileURL: URL, default defaultValue: Value, savePolicy: SavePolicy = .immediately,
        format: Format = .binaryPropertyList, scheduler: any AutosaveScheduler = DispatchAutosaveScheduler()
    ) {
        self.fileURL = fileURL.standardizedFileURL
        self.defaultValue = defaultValue
        self.savePolicy = savePolicy
        self.format = format
        self.scheduler = scheduler
        AutosaveRegistry.register(self)
    }

    /// A value stored as `fileName` in the application-support folder of `appID` (SB-1).
    public convenience init(
        fileName: String, appID: String, default defaultValue: Value, savePolicy: SavePolicy = .immediately,
        format: Format = .binaryPropertyList, scheduler: any AutosaveScheduler = DispatchAutosaveScheduler()
    ) {
        self.init(
            fileURL: SearchPaths(appID: appID).applicationSupport.appendingPathComponent(fileName),
            default: defaultValue, savePolicy: savePolicy, format: format, scheduler: scheduler)
    }

    deinit {
        AutosaveRegistry.unregister(ObjectIdentifier(self))
        if hasUnsavedChanges { saveLogging() }
    }

    // MARK: Access

    /// The value, read from the file on first use. Setting it saves according to ``savePolicy``.
    public var value: Value {
        get {
            state.withLock { loadedValue(&$0) }
        }
        set {
            modify { $0 = newValue }
        }
    }

    /// The value, reading the file on first use; throws a load failure (a corrupt or unreadable
    /// file) once, after which the default value is in use.
    public func load() throws -> Value {
        try state.withLock { state in
            let value = loadedValue(&state)
            if let error = state.pendingLoadError {
                state.pendingLoadError = nil
                throw error
            }
            return value
        }
    }

    /// Changes the value in place under the lock, then saves according to ``savePolicy``.
    /// `body` must not use this instance (the lock is not recursive).
    @discardableResult
    public func modify<Result>(_ body: (inout Value) throws -> Result) rethrows -> Result {
        let (result, scheduleAfter): (Result, Duration?) = try state.withLock { state in
            var value = loadedValue(&state)
            state.pendingLoadError = nil
            let result = try body(&value)
            state.loaded = value
            state.generation += 1
            switch savePolicy {
            case .immediately:
                return (result, nil)
            case .coalesced(let delay):
                if state.saveScheduled { return (result, nil) }
                state.saveScheduled = true
                return (result, delay)
            }
        }
        switch scheduleAfter {
        case nil where savePolicy == .immediately:
            saveLogging()
        case nil:
            break
        case let delay?:
            scheduler.schedule(after: delay) { [weak self] in
                guard let self else { return }
                self.state.withLock { $0.saveScheduled = false }
                self.saveLogging()
            }
        }
        return result
    }

    /// Writes pending changes now.
    public func flush() throws {
        try save()
    }

    /// True if a change has not been written yet.
    public var hasUnsavedChanges: Bool { state.withLock { $0.generation != $0.savedGeneration } }

    /// How many times this instance has written its file.
    public var writeCount: Int { state.withLock { $0.writes } }

    /// The error of the last save that failed, cleared by a successful save.
    public var lastSaveError: (any Error)? { state.withLock { $0.lastError } }

    // MARK: Loading

    /// The loaded value, reading the file the first time; `state` is the locked state.
    private func loadedValue(_ state: inout State) -> Value {
        if let loaded = state.loaded { return loaded }
        let value: Value
        do {
            value = try readFile() ?? defaultValue
        } catch {
            state.pendingLoadError = error
            autosaveLogger.warning("\(error); using the default value")
            value = defaultValue
        }
        state.loaded = value
        return value
    }

    private func readFile() throws(AutosavedValueError) -> Value? {
        let data: Data
        do {
            data = try Data(contentsOf: fileURL)
        } catch let error as CocoaError
            where error.code == .fileReadNoSuchFile || error.code == .fileNoSuchFile
        {
            return nil
        } catch {
            // Set aside too: a save would replace a file nobody could read.
            throw .unreadable(fileURL, preservedAt: preserveUnreadableFile(), underlying: error)
        }
        do {
            switch format {
            case .binaryPropertyList, .xmlPropertyList:
                return try PropertyListDecoder().decode(Value.self, from: data)
            case .json:
                return try JSONDecoder().decode(Value.self, from: data)
            }
        } catch {
            // Keep the bytes for the user: the next save would otherwise replace them.
            let preserved = preserveCorruptFile()
            throw .corruptFile(fileURL, preservedAt: preserved, underlying: error)
        }
    }

    private func preserveUnreadableFile() -> URL? {
        FileManager.default.fileExists(atPath: fileURL.path) ? preserveCorruptFile() : nil
    }

    private func preserveCorruptFile() -> URL? {
        let style = Date.ISO8601FormatStyle(dateSeparator: .omitted, timeSeparator: .omitted)
        let stamp = Date().formatted(style)
        let folder = fileURL.deletingLastPathComponent()
        for attempt in 0..<100 {
            let suffix = attempt == 0 ? "" : "-\(attempt)"
            let target = folder.appendingPathComponent(
                "\(fileURL.lastPathComponent).corrupt-\(stamp)\(suffix)")
            // link + unlink never replaces an existing file, unlike rename.
            if link(fileURL.path, target.path) == 0 {
                unlink(fileURL.path)
                return target
            }
            if errno != EEXIST { break }
        }
        autosaveLogger.error("could not set aside the corrupt file \(fileURL.path)")
        return nil
    }

    // MARK: Saving

    private func saveLogging() {
        do {
            try save()
        } catch {
            autosaveLogger.error("autosave of \(fileURL.path) failed: \(error)")
        }
    }

    private func save() throws {
        try ioLock.withLock { _ in
            let snapshot: (Value, Int)? = state.withLock { state in
                guard state.generation != state.savedGeneration, let loaded = state.loaded else { return nil }
                return (loaded, state.generation)
            }
            guard let (value, savingGeneration) = snapshot else { return }
            do {
                let data = try encode(value)
                try AtomicFile.write(data, to: fileURL)
                state.withLock {
                    $0.savedGeneration = savingGeneration
                    $0.writes += 1
                    $0.lastError = nil
                }
            } catch {
                state.withLock { $0.lastError = error }
                throw error
            }
        }
    }

    private func encode(_ value: Value) throws(AutosavedValueError) -> Data {
        do {
            switch format {
            case .binaryPropertyList, .xmlPropertyList:
                let encoder = PropertyListEncoder()
                encoder.outputFormat = format == .binaryPropertyList ? .binary : .xml
                return try encoder.encode(value)
            case .json:
                let encoder = JSONEncoder()
                encoder.outputFormatting = [.sortedKeys]
                return try encoder.encode(value)
            }
        } catch {
            throw .encodingFailed(fileURL, underlying: error)
        }
    }
}

extension AutosavedValue: AutosaveFlushing {
    func flushForExit() throws { try save() }
}

extension AutosavedValue where Value == Never {
    /// Saves the pending changes of every live ``AutosavedValue``; returns the errors.
    @discardableResult
    public static func flushAll() -> [any Error] { AutosaveRegistry.flushAll() }

    /// Runs ``flushAll()`` at normal exit (`atexit`) and when one of `signals` arrives; then
    /// exits with status 128 + the signal number. Call once, early; later calls do nothing.
    ///
    /// The signals' handler only wakes a private thread, so the saving runs as ordinary code,
    /// never inside a signal handler; a signal sent once this has returned is handled. This
    /// replaces the signals' default disposition for the whole process: a program with its own
    /// SIGTERM handling should call ``flushAll()`` from it instead.
    public static func installExitHandlers(signals: [Int32] = [SIGTERM, SIGINT]) {
        AutosaveRegistry.installExitHandlers(signals: signals)
    }
}

/// Why an ``AutosavedValue`` could not be read or written.
public enum AutosavedValueError: Error, CustomStringConvertible {
    /// The file exists but does not decode; it was renamed to `preservedAt` (nil if that failed).
    case corruptFile(URL, preservedAt: URL?, underlying: any Error)
    /// The file exists but could not be read (permissions, I/O); it was set aside as for
    /// ``corruptFile(_:preservedAt:underlying:)``.
    case unreadable(URL, preservedAt: URL?, underlying: any Error)
    /// The value could not be encoded; the file was left untouched.
    case encodingFailed(URL, underlying: any Error)
    /// The file could not be written; the previous version is intact.
    case writeFailed(URL, underlying: any Error)

    public var description: String {
        switch self {
        case .corruptFile(let url, let preserved, let error):
            let kept = preserved.map { "kept as \($0.lastPathComponent)" } ?? "could not be set aside"
            return "\(url.path) is corrupt (\(error)); \(kept)"
        case .unreadable(let url, let preserved, let error):
            let kept = preserved.map { "kept as \($0.lastPathComponent)" } ?? "not set aside"
            return "cannot read \(url.path) (\(error)); \(kept)"
        case .encodingFailed(let url, let error):
            return "cannot encode the value for \(url.path): \(error)"
        case .writeFailed(let url, let error):
            return "cannot write \(url.path): \(error)"
        }
    }
}

// MARK: - Property wrapper

/// An ``AutosavedValue`` as a property: `@Autosaved(file: url) var items: [Item] = []`.
///
/// The initial value is the default used until the file exists; `$items` is the
/// ``AutosavedValue`` (for ``AutosavedValue/modify(_:)``, ``AutosavedValue/flush()``).
@propertyWrapper
public struct Autosaved<Value: Codable & Sendable>: Sendable {
    public let projectedValue: AutosavedValue<Value>

    /// Stored at `file`.
    public init(
        wrappedValue: Value, file: URL, savePolicy: AutosavedValue<Value>.SavePolicy = .immediately,
        format: AutosavedValue<Value>.Format = .binaryPropertyList,
        scheduler: any AutosaveScheduler = DispatchAutosaveScheduler()
    ) {
        projectedValue = AutosavedValue(
            fileURL: file, default: wrappedValue, savePolicy: savePolicy, format: format, scheduler: scheduler
        )
    }

    /// Stored as `file` in the application-support folder of `appID`.
    public init(
        wrappedValue: Value, file: String, appID: String,
        savePolicy: AutosavedValue<Value>.SavePolicy = .immediately,
        format: AutosavedValue<Value>.Format = .binaryPropertyList,
        scheduler: any AutosaveScheduler = DispatchAutosaveScheduler()
    ) {
        projectedValue = AutosavedValue(
            fileName: file, appID: appID, default: wrappedValue, savePolicy: savePolicy, format: format,
            scheduler: scheduler)
    }

    public var wrappedValue: Value {
        get { projectedValue.value }
        nonmutating set { projectedValue.value = newValue }
    }
}

// MARK: - Scheduling

/// Runs delayed saves; inject ``ManualAutosaveScheduler`` to drive coalescing in tests.
public protocol AutosaveScheduler: Sendable {
    /// Runs `action` once, `delay` from now.
    func schedule(after delay: Duration, _ action: @escaping @Sendable () -> Void)
}

/// Runs delayed saves on a dispatch queue.
public struct DispatchAutosaveScheduler: AutosaveScheduler {
    private let queue: DispatchQueue

    public init(queue: DispatchQueue = .global(qos: .utility)) {
        self.queue = queue
    }

    public func schedule(after delay: Duration, _ action: @escaping @Sendable () -> Void) {
        let (seconds, attoseconds) = delay.components
        let nanoseconds = max(0, seconds) * 1_000_000_000 + max(0, attoseconds) / 1_000_000_000
        queue.asyncAfter(deadline: .now() + .nanoseconds(Int(clamping: nanoseconds)), execute: action)
    }
}

/// A scheduler whose time moves only when ``advance(by:)`` is called.
public final class ManualAutosaveScheduler: AutosaveScheduler {
    private struct Job {
        let due: Duration
        let order: Int
        let action: @Sendable () -> Void
    }

    private struct State {
        var now: Duration = .zero
        var jobs: [Job] = []
        var order = 0
    }

    private let state = Mutex(State())

    public init() {}

    /// Time elapsed since creation.
    public var now: Duration { state.withLock { $0.now } }

    /// Actions scheduled and not yet run.
    public var pendingCount: Int { state.withLock { $0.jobs.count } }

    public func schedule(after delay: Duration, _ action: @escaping @Sendable () -> Void) {
        state.withLock { state in
            state.order += 1
            state.jobs.append(Job(due: state.now + delay, order: state.order, action: action))
        }
    }

    /// Moves time forward by `duration`, running every action that falls due, in order.
    public func advance(by duration: Duration) {
        let target = state.withLock { $0.now + duration }
        while true {
            // Run outside the lock: actions may schedule again.
            let next: Job? = state.withLock { state in
                guard
                    let index = state.jobs.indices.filter({ state.jobs[$0].due <= target })
                        .min(by: {
                            (state.jobs[$0].due, state.jobs[$0].order) < (
                                state.jobs[$1].due, state.jobs[$1].order
                            )
                        })
                else {
                    state.now = target
                    return nil
                }
                let job = state.jobs.remove(at: index)
                state.now = max(state.now, job.due)
                return job
            }
            guard let next else { return }
            next.action()
        }
    }
}

// MARK: - Registry and exit handling

private let autosaveLogger = Logger(label: "docfs.autosavedvalue")

protocol AutosaveFlushing: AnyObject, Sendable {
    func flushForExit() throws
}

private struct WeakFlushable: Sendable {
    weak var object: (any AutosaveFlushing)?
}

enum AutosaveRegistry {
    private static let live = Mutex<[ObjectIdentifier: WeakFlushable]>([:])
    private static let exitHandlersInstalled = Mutex(false)

    static func register(_ object: any AutosaveFlushing) {
        live.withLock { $0[ObjectIdentifier(object)] = WeakFlushable(object: object) }
    }

    static func unregister(_ id: ObjectIdentifier) {
        _ = live.withLock { $0.removeValue(forKey: id) }
    }

    static func flushAll() -> [any Error] {
        let objects = live.withLock { $0.values.compactMap(\.object) }
        var errors: [any Error] = []
        for object in objects {
            do {
                try object.flushForExit()
            } catch {
                autosaveLogger.error("flush at exit failed: \(error)")
                errors.append(error)
            }
        }
        return errors
    }

    static func installExitHandlers(signals: [Int32]) {
        exitHandlersInstalled.withLock { installed in
            guard !installed else { return }
            installed = true
            atexit { _ = AutosaveRegistry.flushAll() }
            // A handler only writes the signal's number to a pipe (async-signal-safe); a thread
            // saves and exits. sigaction takes effect before this returns, so a signal sent
            // right after is never lost (a DispatchSource registers later, on its own queue,
            // and a signal arriving in between was ignored).
            var fds: [Int32] = [-1, -1]
            guard pipe(&fds) == 0 else {
                autosaveLogger.error(
                    "cannot install exit handlers: pipe: \(String(cString: strerror(errno)))")
                return
            }
            for fd in fds { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
            exitSignalPipe.store(fds[1], ordering: .releasing)
            let readFD = fds[0]
            let watcher = Thread {
                var byte: UInt8 = 0
                while true {
                    let n = read(readFD, &byte, 1)
                    if n < 0 && errno == EINTR { continue }
                    guard n == 1 else { return }
                    _ = AutosaveRegistry.flushAll()
                    exit(128 + Int32(byte))
                }
            }
            watcher.name = "docfs.autosave.signals"
            watcher.start()
            for signo in signals {
                var action = sigaction()
                action.__sigaction_handler.sa_handler = { signo in
                    var byte = UInt8(truncatingIfNeeded: signo)
                    let fd = exitSignalPipe.load(ordering: .relaxed)
                    if fd >= 0 { _ = write(fd, &byte, 1) }
                }
                sigemptyset(&action.sa_mask)
                action.sa_flags = Int32(SA_RESTART)
                if sigaction(signo, &action, nil) != 0 {
                    autosaveLogger.error("cannot handle signal \(signo): \(String(cString: strerror(errno)))")
                }
            }
        }
    }
}

/// The write end of the exit handlers' signal pipe (-1 until installed).
private let exitSignalPipe = Atomic<Int32>(-1)

// MARK: - Atomic file writing

enum AtomicFile {
    /// Writes `data` to a temporary file beside `url`, syncs it and renames it over `url`, so the
    /// file is always either the old or the new complete contents. The result has mode 0600.
    static func write(_ data: Data, to url: URL) throws(AutosavedValueError) {
        let folder = url.deletingLastPathComponent()
        do {
            try FileManager.default.createDirectory(
                at: folder, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        } catch {
            throw .writeFailed(url, underlying: error)
        }
        let temporary = folder.appendingPathComponent(
            ".\(url.lastPathComponent).\(getpid()).\(UInt32.random(in: 0...UInt32.max)).tmp")
        do {
            let fd = try POSIX.open(temporary.path, O_WRONLY | O_CREAT | O_EXCL, 0o600)
            do {
                defer { POSIX.close(fd) }
                // The umask may have removed bits but never adds any; fchmod makes it exact.
                _ = try POSIX.check { fchmod(fd, 0o600) }
                try POSIX.writeAll(fd, data)
                try POSIX.fsync(fd)
            }
            _ = try POSIX.check { rename(temporary.path, url.path) }
        } catch {
            unlink(temporary.path)
            throw .writeFailed(url, underlying: error)
        }
        // Make the rename itself durable.
        if let dirfd = try? POSIX.open(folder.path, O_RDONLY | O_DIRECTORY) {
            _ = try? POSIX.fsync(dirfd)
            POSIX.close(dirfd)
        }
    }
}
