import Foundation
import Synchronization

/// Apple's autosave timing (UD-31), as a pure value so it can be tested on its own.
///
/// A change schedules a save after ``baseDelay`` (15 s). If one is already pending, the delay is
/// recomputed from what remains of ``maximumDelay`` (300 s) since the last save: none left → now;
/// at least half → 15 s; at least a quarter → 7.5 s; else 1.875 s (or what remains, if less). So
/// continuing edits cannot postpone a save past the maximum.
struct AutosaveSchedule {
    var baseDelay: Duration = .seconds(15)
    var maximumDelay: Duration = .seconds(300)
    /// When (on the document's clock) the document was last opened or saved, or first changed
    /// from a clean state.
    private(set) var lastSave: Duration?

    mutating func noteSaved(at now: Duration) { lastSave = now }
    mutating func noteFirstChange(at now: Duration) { lastSave = now }

    /// The delay before the next autosave, given whether one is already pending.
    func delay(now: Duration, pending: Bool) -> Duration {
        guard pending, let lastSave else { return baseDelay }
        let remaining = maximumDelay - (now - lastSave)
        if remaining <= .zero { return .zero }
        if remaining >= maximumDelay / 2 { return baseDelay }
        if remaining >= maximumDelay / 4 { return baseDelay / 2 }
        return min(baseDelay / 8, remaining)
    }
}

/// The time source of autosave and change monitoring: any `Clock`, so tests can drive a manual
/// one instead of sleeping.
public struct DocumentClock: Sendable {
    private let elapsed: @Sendable () -> Duration
    private let sleeper: @Sendable (Duration) async throws -> Void

    /// Wraps `clock`.
    public init<C: Clock>(_ clock: C) where C.Duration == Duration {
        let origin = clock.now
        elapsed = { origin.duration(to: clock.now) }
        sleeper = { try await clock.sleep(for: $0) }
    }

    /// Time since the clock was wrapped.
    public var now: Duration { elapsed() }

    /// Suspends for `duration` of this clock's time.
    public func sleep(for duration: Duration) async throws { try await sleeper(duration) }

    /// The real, monotonic clock.
    public static let continuous = DocumentClock(ContinuousClock())
}

extension Document {
    /// The delay before an autosave after a change (Apple: 15 s, UD-31).
    public var autosaveDelay: Duration {
        get { autosave.baseDelay }
        set { autosave.baseDelay = newValue }
    }

    /// The longest continuing edits may postpone an autosave (Apple: 300 s, UD-31).
    public var maximumAutosaveDelay: Duration {
        get { autosave.maximumDelay }
        set { autosave.maximumDelay = newValue }
    }

    /// Whether an autosave is scheduled.
    public var hasPendingAutosave: Bool { autosaveTask != nil }

    func scheduleAutosave() {
        guard !documentState.contains(.closed), hasUnsavedChanges else {
            autosaveTask?.cancel()
            autosaveTask = nil
            return
        }
        let delay = autosave.delay(now: clock.now, pending: autosaveTask != nil)
        autosaveTask?.cancel()
        let clock = self.clock
        autosaveTask = Task { [weak self] in
            if delay > .zero {
                do { try await clock.sleep(for: delay) } catch { return }
            }
            guard let self, !Task.isCancelled else { return }
            self.autosaveTask = nil
            await self.autosave()
        }
    }

    /// Saves if there are unsaved changes (UD-31); reschedules if changes remain afterwards.
    @discardableResult
    public func autosave() async -> Bool {
        // A save under way may be saving these very changes: look once it is done, rather than
        // write the same contents again behind it.
        await untilSaved()
        guard hasUnsavedChanges, !documentState.contains(.closed) else { return true }
        let saved = await save(to: fileURL, for: .forOverwriting)
        if hasUnsavedChanges { scheduleAutosave() }
        return saved
    }

    // MARK: Saving everything at exit

    /// Saves every open document with unsaved changes (for shutdown, UD-32).
    public static func saveAllOpenDocuments() async {
        for document in OpenDocuments.shared.all where document.hasUnsavedChanges {
            _ = await document.save(to: document.fileURL, for: .forOverwriting)
        }
    }

    /// Installs SIGTERM and SIGINT handlers that save every open document and flush every
    /// ``AutosavedValue``, then exit with 128 + the signal number. The handlers run on the main
    /// actor, not in signal context. Use it instead of `AutosavedValue.installExitHandlers()`.
    public static func saveOpenDocumentsOnTermination() {
        TerminationHandler.install()
    }
}

/// The open documents, weakly held.
@MainActor
package final class OpenDocuments {
    static let shared = OpenDocuments()
    private var documents: [ObjectIdentifier: WeakDocument] = [:]

    /// Where set, the documents opened in the task, and all that the task alone counts as open
    /// (``Document/saveAllOpenDocuments()`` in it saves only those). Tests share one process:
    /// without it, one test's "save everything" saved another test's unsaved document.
    @TaskLocal package static var group: String?

    struct WeakDocument {
        weak var document: Document?
        var group: String?
    }

    func add(_ document: Document) {
        documents[ObjectIdentifier(document)] = WeakDocument(document: document, group: Self.group)
    }
    func remove(_ document: Document) { documents[ObjectIdentifier(document)] = nil }
    var all: [Document] {
        let group = Self.group
        return documents.values.filter { group == nil || $0.group == group }.compactMap(\.document)
    }
}

/// Turns SIGTERM/SIGINT into a save of all open documents followed by exit.
@MainActor
enum TerminationHandler {
    private static var sources: [any DispatchSourceSignal] = []

    static func install() {
        guard sources.isEmpty else { return }
        for signo in [SIGTERM, SIGINT] {
            signal(signo, SIG_IGN)  // let the dispatch source, not the default action, handle it
            let source = DispatchSource.makeSignalSource(signal: signo, queue: .main)
            source.setEventHandler {
                Task { @MainActor in
                    await Document.saveAllOpenDocuments()
                    _ = AutosavedValue.flushAll()  // one handler for both, so neither pre-empts the other
                    exit(128 + signo)
                }
            }
            source.resume()
            sources.append(source)
        }
    }
}
