import Foundation
import Logging
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// A document: Apple's `UIDocument` for Linux, with Swift concurrency instead of completion
/// handlers. Subclass it and override ``contents(forType:)`` and ``load(fromContents:ofType:)``
/// with contents that are `Data` (a flat file) or a ``FileWrapper`` (a package).
///
/// Rule ids (UD-, FC-, FV-) are defined in `docs/library/apple-behaviours.md`. Differences
/// from Apple (`docs/library/differences-from-apple.md`):
/// - Packages are read lazily (UD-20): wrappers' bytes are read when first asked for.
/// - A document can live in a ``DocumentStore`` as well as on disk (``DocumentLocation``).
/// - Changes by other processes are found by polling (Linux has no file presenters): every
///   ``monitoringInterval`` on the document's ``clock``, and whenever ``checkForExternalChanges()``
///   is called.
/// - `close()` on a document that is not open returns false at once (Apple never calls back,
///   UD-15).
@MainActor
open class Document {
    /// The document's state bits (UD-5).
    public struct State: OptionSet, Sendable, Hashable, CustomStringConvertible {
        public let rawValue: UInt
        public init(rawValue: UInt) { self.rawValue = rawValue }
        public static let normal: State = []
        public static let closed = State(rawValue: 1)
        public static let inConflict = State(rawValue: 2)
        public static let savingError = State(rawValue: 4)
        public static let editingDisabled = State(rawValue: 8)
        public static let progressAvailable = State(rawValue: 16)

        public var description: String {
            let names: [(State, String)] = [
                (.closed, "closed"), (.inConflict, "inConflict"), (.savingError, "savingError"),
                (.editingDisabled, "editingDisabled"), (.progressAvailable, "progressAvailable"),
            ]
            let set = names.filter { contains($0.0) }.map(\.1)
            return set.isEmpty ? "normal" : set.joined(separator: ", ")
        }
    }

    /// UIDocument's change kinds, with UIKit's raw values (UD-37).
    public enum ChangeKind: Int, Sendable {
        case done = 0
        case undone = 1
        case redone = 2
        case cleared = 3
    }

    /// UIDocument's save operations (UD-38).
    public enum SaveOperation: Int, Sendable {
        case forCreating = 0
        case forOverwriting = 1
    }

    /// A snapshot of the change counters, taken when a save starts (UD-29).
    public struct ChangeCountToken: Sendable, Equatable {
        let changeCount: Int
        let generation: Int
    }

    /// Posted on each real change of ``documentState``, with the document as object (UD-11).
    public static let stateChangedNotification = Notification.Name("UIDocumentStateChangedNotification")
    /// Posted after the document reloaded because another process changed it (the seeds'
    /// `noteDocumentContentsUpdated`).
    public static let contentsDidUpdateNotification = Notification.Name(
        "DocFSDocumentContentsDidUpdateNotification")

    static let logger = Logger(label: "docfs.document")

    // MARK: Identity

    /// Values other threads may read (UD-2: overrides may run on background threads).
    struct Shared: Sendable {
        var location: DocumentLocation
        var fileType: String?
        /// For store documents: the version the in-memory contents are based on.
        var storeVersion: VersionID?
        var storeDocument: DocumentID?
    }

    let shared: Mutex<Shared>

    /// Where the document lives.
    nonisolated public var location: DocumentLocation { shared.withLock { $0.location } }
    /// The document's URL: a file or package, or `<store path>/<name>` for a store document.
    nonisolated public var fileURL: URL { location.url }
    /// The type identifier, derived from the file name's extension (UD-2).
    nonisolated public var fileType: String? { shared.withLock { $0.fileType } }
    /// The name without its extension (UD-2).
    nonisolated public var localizedName: String { fileURL.deletingPathExtension().lastPathComponent }

    /// The modification date on disk (or in the store) as of the last open, save or revert; nil
    /// before the first (UD-3).
    public private(set) var fileModificationDate: Date?

    /// The document's state (UD-5..UD-10).
    public private(set) var documentState: State = .closed

    /// The clock that times autosave and change monitoring; tests inject a manual one.
    public var clock: DocumentClock = .continuous

    /// How often to look for changes made by other processes while open.
    public var monitoringInterval: Duration = .seconds(1)

    // MARK: Internal state (shared with the extensions in Document+*.swift)

    private var changeCount = 0
    private var generation = 0
    private(set) var isOpening = false
    private(set) var isClosing = false
    private(set) var isSaving = false {
        didSet {
            guard !isSaving else { return }
            let waiting = savingWaiters
            savingWaiters = []
            for waiter in waiting { waiter.resume() }
        }
    }
    private var savingWaiters: [CheckedContinuation<Void, Never>] = []
    private(set) var lastSignature: DiskSignature?
    var monitorTask: Task<Void, Never>?
    private var stateContinuations: [UUID: AsyncStream<State>.Continuation] = [:]
    private(set) var updateContinuations: [UUID: AsyncStream<Void>.Continuation] = [:]
    let fileAccess = FileAccessQueue()
    var autosave = AutosaveSchedule()
    var autosaveTask: Task<Void, Never>?

    // MARK: Creating

    /// A document at `url` (UD-1). The URL must be a non-empty file URL.
    public required init(fileURL url: URL) {
        precondition(url.isFileURL && !url.path.isEmpty, "Document requires a non-empty file URL (UD-1)")
        shared = Mutex(Shared(location: .file(url), fileType: Self.typeIdentifier(for: url)))
    }

    /// The document named `name` in `store`.
    public required init(store: any DocumentStore, name: String) {
        let location = DocumentLocation.store(store, name: name)
        shared = Mutex(Shared(location: location, fileType: Self.typeIdentifier(for: location.url)))
    }

    /// The seeds' open-or-create (`documentAtURL:`): opens the document at `url` if something is
    /// there, else creates it there from the new instance's contents; returns it open, or nil if
    /// neither worked (the error went through ``handleError(_:userInteractionPermitted:)``).
    public static func documentAtURL(_ url: URL) async -> Self? {
        let document = Self(fileURL: url)
        let exists = FileManager.default.fileExists(atPath: url.path)
        let ready = exists ? await document.open() : await document.save(to: url, for: .forCreating)
        return ready ? document : nil
    }

    /// Open-or-create for the document named `name` in `store`.
    public static func document(named name: String, in store: any DocumentStore) async -> Self? {
        let document = Self(store: store, name: name)
        let exists = (try? store.document(named: name)) != nil
        let ready =
            exists ? await document.open() : await document.save(to: document.fileURL, for: .forCreating)
        return ready ? document : nil
    }

    /// The type identifier for a URL's extension (UD-2); directories without one are packages.
    nonisolated static func typeIdentifier(for url: URL) -> String {
        DocumentInfo.typeIdentifier(forName: url.lastPathComponent)
    }

    // MARK: State

    /// Each change of ``documentState``, from now on (UD-11's notification as a stream).
    public var stateChanges: AsyncStream<State> {
        let (stream, continuation) = AsyncStream<State>.makeStream()
        let id = UUID()
        stateContinuations[id] = continuation
        continuation.onTermination = { [weak self] _ in
            Task { @MainActor in self?.stateContinuations[id] = nil }
        }
        return stream
    }

    /// Each reload caused by another process's change, from now on.
    public var contentsUpdates: AsyncStream<Void> {
        let (stream, continuation) = AsyncStream<Void>.makeStream()
        let id = UUID()
        updateContinuations[id] = continuation
        continuation.onTermination = { [weak self] _ in
            Task { @MainActor in self?.updateContinuations[id] = nil }
        }
        return stream
    }

    func setState(_ state: State) {
        guard state != documentState else { return }  // UD-11: no notification for a no-op
        documentState = state
        NotificationCenter.default.post(name: Self.stateChangedNotification, object: self)
        for continuation in stateContinuations.values { continuation.yield(state) }
    }

    func insertState(_ bits: State) { setState(documentState.union(bits)) }
    func removeState(_ bits: State) { setState(documentState.subtracting(bits)) }

    // MARK: Change counting (UD-28, UD-29)

    /// Whether there are changes since the last save (UD-28).
    public var hasUnsavedChanges: Bool { changeCount != 0 || generation != 0 }

    /// Records a change (UD-28) and schedules an autosave (UD-31).
    open func updateChangeCount(_ change: ChangeKind) {
        let wasClean = !hasUnsavedChanges
        switch change {
        case .done:
            if changeCount < 0 { generation += 1 }  // the saved state became unreachable
            changeCount += 1
        case .undone: changeCount -= 1
        case .redone: changeCount += 1
        case .cleared:
            changeCount = 0
            generation = 0
        }
        if change == .done && wasClean { autosave.noteFirstChange(at: clock.now) }
        scheduleAutosave()
    }

    /// The counters as a save starts (UD-29).
    open func changeCountToken(for saveOperation: SaveOperation) -> ChangeCountToken {
        ChangeCountToken(changeCount: changeCount, generation: generation)
    }

    /// Subtracts the counters of `token`, so edits made while the save ran stay unsaved (UD-29).
    open func updateChangeCount(withToken token: ChangeCountToken, for saveOperation: SaveOperation) {
        changeCount -= token.changeCount
        generation -= token.generation
        scheduleAutosave()
    }

    // MARK: Opening, closing, reverting (UD-12..UD-16)

    /// Opens the document: reads it (``read(from:)``) and marks it open. On failure
    /// ``handleError(_:userInteractionPermitted:)`` is called and the document stays closed (UD-14).
    public func open() async -> Bool {
        precondition(!isOpening, "open() called while an open or revert is in flight (UD-13)")
        guard documentState.contains(.closed) else { return true }
        isOpening = true
        defer { isOpening = false }
        do {
            try await read(from: fileURL)
        } catch {
            handleError(error, userInteractionPermitted: true)
            return false
        }
        await noteReadOrSaved()
        removeState(.closed)
        autosave.noteSaved(at: clock.now)
        await updateConflictState()  // UD-8
        startMonitoring()
        return true
    }

    /// Saves unsaved changes, stops monitoring and marks the document closed (UD-15). Returns
    /// false at once if the document is not open or already closing.
    @discardableResult
    public func close() async -> Bool {
        guard !documentState.contains(.closed), !isClosing else { return false }
        isClosing = true
        defer { isClosing = false }
        autosaveTask?.cancel()
        autosaveTask = nil
        var success = true
        if hasUnsavedChanges { success = await save(to: fileURL, for: .forOverwriting) }
        monitorTask?.cancel()
        monitorTask = nil
        OpenDocuments.shared.remove(self)
        insertState(.closed)
        return success
    }

    /// Reads the document again from `url`, discarding unsaved changes (UD-16): editing is
    /// disabled meanwhile, the change count is cleared and undo history removed.
    public func revert(toContentsOf url: URL) async -> Bool {
        precondition(!isOpening, "revert called while an open or revert is in flight (UD-13)")
        if url != fileURL, case .file = location { shared.withLock { $0.location = .file(url) } }
        insertState(.editingDisabled)
        disableEditing()
        isOpening = true
        defer { isOpening = false }
        do {
            try await read(from: url)
        } catch {
            handleError(error, userInteractionPermitted: true)
            return false  // editingDisabled stays set (UD-7)
        }
        await noteReadOrSaved()
        shared.withLock { $0.fileType = Self.typeIdentifier(for: $0.location.url) }
        updateChangeCount(.cleared)
        willRevertClearUndo()
        removeState([.editingDisabled, .closed])
        enableEditing()
        return true
    }

    /// UD-16: a revert removes the undo actions but keeps registration disabled if it was.
    func willRevertClearUndo() {
        guard let manager = createdUndoManager else { return }
        let wasEnabled = manager.isUndoRegistrationEnabled
        manager.removeAllActions()
        if !wasEnabled { manager.disableUndoRegistration() }
    }

    // MARK: Undo (UD-30)

    private var createdUndoManager: UndoManager?
    private var undoObservation: (manager: UndoManager, token: UndoManager.ObserverToken)?

    /// The document's undo manager, created on first access; setting it (nil resets to a new one
    /// on next access) wires it into change counting (UD-30): a closed, non-empty top-level group
    /// counts as `.done`, an undo as `.undone`, a redo as `.redone`. A document that uses it does
    /// not call ``updateChangeCount(_:)`` itself.
    ///
    /// Only top-level closes count (Apple's rule reads "grouping level ≤ 1" as seen inside its
    /// notification), so an app's explicit group nested in the implicit event group counts once.
    public var undoManager: UndoManager! {
        get {
            if let createdUndoManager { return createdUndoManager }
            let manager = UndoManager()
            attach(manager)
            return manager
        }
        set {
            if let undoObservation { undoObservation.manager.removeObserver(undoObservation.token) }
            undoObservation = nil
            createdUndoManager = nil
            if let newValue { attach(newValue) }
        }
    }

    private func attach(_ manager: UndoManager) {
        createdUndoManager = manager
        let token = manager.addObserver { [weak self] event in
            MainActor.assumeIsolated {
                guard let self else { return }
                switch event {
                case .didCloseGroup(let isEmpty, let level) where !isEmpty && level == 0:
                    self.updateChangeCount(.done)
                case .didUndo: self.updateChangeCount(.undone)
                case .didRedo: self.updateChangeCount(.redone)
                default: break
                }
            }
        }
        undoObservation = (manager, token)
    }

    // MARK: Reading (UD-17..UD-20)

    /// Reads the document from `url` and calls ``load(fromContents:ofType:)`` with a `Data` (flat
    /// file) or a lazily read ``FileWrapper`` (package) (UD-17, UD-20). The I/O runs off the main
    /// actor inside a coordinated read (FC-1, UD-12).
    open func read(from url: URL) async throws {
        let location = self.location
        let loaded = try await fileAccess.run { () throws -> ReadContents in
            switch location {
            case .file:
                return try FileCoordinator().coordinate(readingItemAt: url) { url in
                    // Never mapped: another process may truncate a file of the package in place,
                    // and touching a mapping past the new end would crash the app (SIGBUS).
                    let wrapper = try FileWrapper(url: url, options: .withoutMapping)
                    return ReadContents(
                        contents: wrapper.isDirectory ? wrapper : try wrapper.contents(), version: nil,
                        document: nil)
                }
            case .store(let store, let name):
                guard let info = try store.document(named: name) else {
                    throw DocumentStoreError.noSuchDocument(name)
                }
                let wrapper = try store.fileWrapper(for: info.id, at: info.currentVersion)
                let contents: any Sendable = info.kind == .package ? wrapper : try wrapper.contents()
                return ReadContents(contents: contents, version: info.currentVersion, document: info.id)
            }
        }
        try load(fromContents: loaded.contents, ofType: fileType)
        shared.withLock {
            $0.storeVersion = loaded.version ?? $0.storeVersion
            $0.storeDocument = loaded.document ?? $0.storeDocument
        }
    }

    /// Loads the model from `contents` (`Data` or ``FileWrapper``). Subclasses must override it;
    /// the default throws (UD-18).
    open func load(fromContents contents: Any, ofType typeName: String?) throws {
        throw DocumentError.subclassResponsibility("load(fromContents:ofType:)")
    }

    // MARK: Saving (UD-21..UD-27)

    /// The model as `Data` or a ``FileWrapper``. Subclasses must override it; the default throws.
    open func contents(forType typeName: String) throws -> Any {
        throw DocumentError.subclassResponsibility("contents(forType:)")
    }

    /// The type to save as: by default ``fileType`` (UD-4). A document that must change type
    /// (RTF → RTFD when an image is added) returns the new one and is saved under the new
    /// extension.
    open var savingFileType: String? { fileType }

    /// The extension for `typeName` (UD-4): by default the one the type was derived from, or the
    /// type identifier's last component.
    open func fileNameExtension(forType typeName: String, saveOperation: SaveOperation) -> String {
        switch typeName {
        case "public.plain-text": return "txt"
        case "public.rtf": return "rtf"
        case "com.apple.rtfd": return "rtfd"
        case "public.png": return "png"
        case "public.jpeg": return "jpg"
        case "public.json": return "json"
        case "com.apple.property-list": return "plist"
        default:
            if typeName.hasPrefix("dyn.docfs.") { return String(typeName.dropFirst("dyn.docfs.".count)) }
            return typeName.split(separator: ".").last.map(String.init) ?? typeName
        }
    }

    /// Returns once no save is under way.
    func untilSaved() async {
        while isSaving { await withCheckedContinuation { savingWaiters.append($0) } }
    }

    /// Saves the document to `url` (UD-21): takes ``contents(forType:)`` on the main actor, then
    /// writes them safely off it (``writeContents(_:andAttributes:safelyTo:for:)``). Saving to
    /// another URL moves the document there (UD-22). On success the document is open, its URL and
    /// type updated and the change count settled by token (UD-26); on failure
    /// ``handleError(_:userInteractionPermitted:)`` is called and the previous version is intact.
    @discardableResult
    public func save(to url: URL, for saveOperation: SaveOperation) async -> Bool {
        var target = url
        let type = savingFileType ?? fileType ?? "public.data"
        if type != fileType {
            target = url.deletingPathExtension().appendingPathExtension(
                fileNameExtension(forType: type, saveOperation: saveOperation))
        }
        let contents: Any
        do { contents = try self.contents(forType: type) } catch {
            handleError(error, userInteractionPermitted: true)
            return false
        }
        willSaveCloseUndoGroup()
        let token = changeCountToken(for: saveOperation)
        let attributes: [AnyHashable: Any]
        do { attributes = try fileAttributesToWrite(to: target, for: saveOperation) } catch {
            handleError(error, userInteractionPermitted: true)
            return false
        }
        let previousURL = fileURL
        let destination = target
        let box = ContentsBox(contents, attributes: attributes)
        isSaving = true
        defer { isSaving = false }
        do {
            try await fileAccess.run { [self] in
                switch location {
                case .file:
                    try FileCoordinator().coordinate(writingItemAt: destination, options: .forReplacing) {
                        target in
                        try writeContents(
                            box.contents, andAttributes: box.attributes, safelyTo: target, for: saveOperation)
                    }
                case .store:
                    try writeContents(
                        box.contents, andAttributes: box.attributes, safelyTo: destination, for: saveOperation
                    )
                }
            }
        } catch {
            handleError(error, userInteractionPermitted: true)
            return false
        }
        if target.standardizedFileURL != previousURL.standardizedFileURL {
            await movedAfterSave(from: previousURL, to: target)
        }
        shared.withLock { $0.fileType = Self.typeIdentifier(for: $0.location.url) }
        await noteReadOrSaved()
        updateChangeCount(withToken: token, for: saveOperation)
        autosave.noteSaved(at: clock.now)
        if documentState.contains(.closed) {
            removeState(.closed)
            startMonitoring()
        }
        if storeConflictPending.exchange(false, ordering: .relaxed) {
            insertState(.inConflict)
        }
        return true
    }

    /// UD-21: the open undo group is closed before the save takes its token, so the edit it holds
    /// counts as saved.
    func willSaveCloseUndoGroup() {
        createdUndoManager?.endEventGrouping()
    }

    /// UD-22: a save to a new URL is a move: the old item is removed and the location updated.
    private func movedAfterSave(from old: URL, to new: URL) async {
        switch location {
        case .file:
            shared.withLock { $0.location = .file(new) }
            if FileManager.default.fileExists(atPath: old.path) {
                try? await fileAccess.run { try FileManager.default.removeItem(at: old) }
            }
        case .store(let store, _):
            shared.withLock { $0.location = .store(store, name: new.lastPathComponent) }
        }
    }

    /// Attributes for the save (UD-23): Apple hides the extension of a new document; Linux has no
    /// such attribute, so both operations return an empty dictionary.
    open func fileAttributesToWrite(to url: URL, for saveOperation: SaveOperation) throws -> [AnyHashable:
        Any]
    {
        [:]
    }

    /// The safe-save (UD-24): the new version is built in a hidden folder beside `url`, made
    /// durable and swapped in with `renameat2(RENAME_EXCHANGE)`, so a failure leaves the previous
    /// version intact. For a store document it is one store transaction. Runs off the main actor.
    nonisolated open func writeContents(
        _ contents: Any, andAttributes attributes: [AnyHashable: Any]?, safelyTo url: URL,
        for saveOperation: SaveOperation
    ) throws {
        switch location {
        case .file(let current):
            let scratch = try ScratchArea(replacing: url)
            let original = saveOperation == .forOverwriting ? current : nil
            try writeContents(
                contents, to: URL(fileURLWithPath: scratch.itemPath), for: saveOperation,
                originalContentsURL: original)
            _ = try scratch.commit()
            // Wrappers written with name updating now read from the scratch folder, which is
            // about to disappear: point them at the document.
            (contents as? FileWrapper)?.relocateDiskSources(from: scratch.itemPath, to: url.path)
        case .store(let store, let currentName):
            try saveIntoStore(
                store, currentName: currentName, contents: contents, to: url, for: saveOperation)
        }
    }

    /// Writes `contents` at `url` without atomicity of its own (UD-25): a ``FileWrapper`` with
    /// name updating and incremental hard links from `originalContentsURL` (W-6), or `Data`.
    /// Everything written is fsynced. Runs off the main actor.
    nonisolated open func writeContents(
        _ contents: Any, to url: URL, for saveOperation: SaveOperation, originalContentsURL: URL?
    ) throws {
        if let wrapper = contents as? FileWrapper {
            var options: FileWrapper.WritingOptions = [.durable]
            if saveOperation == .forOverwriting { options.insert(.withNameUpdating) }
            try wrapper.write(to: url, options: options, originalContentsURL: originalContentsURL)
        } else if let data = contents as? Data {
            try FileWrapper(regularFileWithContents: data).write(to: url, options: [.durable])
        } else {
            throw DocumentError.unsupportedContents(String(describing: type(of: contents)))
        }
    }

    private let storeConflictPending = Atomic<Bool>(false)

    nonisolated private func saveIntoStore(
        _ store: any DocumentStore, currentName: String, contents: Any, to url: URL,
        for saveOperation: SaveOperation
    ) throws {
        guard
            url.deletingLastPathComponent().standardizedFileURL.path
                == URL(fileURLWithPath: store.location).standardizedFileURL.path
        else {
            throw DocumentError.outsideStore(url.path, store: store.location)
        }
        let name = url.lastPathComponent
        let isPackage = contents is FileWrapper
        guard isPackage || contents is Data else {
            throw DocumentError.unsupportedContents(String(describing: type(of: contents)))
        }
        var (documentID, base) = shared.withLock { ($0.storeDocument, $0.storeVersion) }
        if documentID == nil || saveOperation == .forCreating || name != currentName {
            if let existing = try store.document(named: name) {
                if saveOperation == .forCreating, documentID != existing.id {
                    // UD-24: creating over an existing document replaces it; its history stays.
                    try store.deleteDocument(existing.id, origin: "document \(getpid())")
                    documentID = nil
                } else {
                    documentID = existing.id
                    base = base ?? existing.currentVersion
                }
            }
            if documentID == nil {
                let created = try store.createDocument(
                    named: name, kind: isPackage ? .package : .flat, type: fileType, permissions: nil,
                    origin: "document \(getpid())")
                documentID = created.id
                base = created.currentVersion
            }
        }
        guard let documentID, let base else { throw DocumentStoreError.noSuchDocument(name) }
        let wrapper =
            (contents as? FileWrapper) ?? FileWrapper(regularFileWithContents: contents as? Data ?? Data())
        let result = try store.save(
            wrapper, to: documentID, base: base, origin: "document \(getpid())",
            conflictPolicy: .rebaseIfDisjoint)
        if result.isConflict { storeConflictPending.store(true, ordering: .relaxed) }
        shared.withLock {
            $0.storeDocument = documentID
            // A conflict version branches off the main line; keep building on what the store has now.
            $0.storeVersion =
                result.isConflict
                ? (try? store.document(documentID).currentVersion) ?? base : result.version.id
        }
    }

    /// After an open, save or revert: the modification date and the fingerprint used to notice
    /// other processes' changes (UD-3).
    private func noteReadOrSaved() async {
        let location = self.location
        let (date, signature) = await fileAccess.run { () -> (Date?, DiskSignature?) in
            switch location {
            case .file(let url): return (DiskSignature.modificationDate(of: url), DiskSignature(of: url))
            case .store(let store, let name):
                let info = try? store.document(named: name)
                return (info.map { $0.modified.date }, nil)
            }
        }
        fileModificationDate = date
        lastSignature = signature
    }

    // MARK: Errors (UD-34)

    /// Handles an open or save error: by default calls ``finishedHandlingError(_:recovered:)`` with
    /// `recovered: false`, which sets `savingError` (UD-9, UD-34).
    open func handleError(_ error: any Error, userInteractionPermitted: Bool) {
        Self.logger.error("\(fileURL.lastPathComponent): \(String(describing: error))")
        finishedHandlingError(error, recovered: false)
    }

    /// Ends error handling: `recovered: false` sets `savingError`, `true` clears it (UD-9).
    open func finishedHandlingError(_ error: any Error, recovered: Bool) {
        if recovered { removeState(.savingError) } else { insertState(.savingError) }
    }

    /// Called when error handling may no longer interact with the user.
    open func userInteractionNoLongerPermitted(forError error: any Error) {}

    /// Called when editing must stop (a revert or another process's write is in progress, UD-7).
    open func disableEditing() {}

    /// Called when editing may resume.
    open func enableEditing() {}

    // MARK: Reloading after other processes' changes

    // The monitoring and the reload are in Document+ExternalChanges.swift; this hook stays in the
    // class body because a declaration in an extension cannot be overridden.

    /// Called after a reload caused by another process (the seeds' `noteDocumentContentsUpdated`).
    open func documentContentsDidUpdate() {}
}

/// Errors of the document layer.
public enum DocumentError: Error, Sendable, Equatable, CustomStringConvertible, LocalizedError {
    case subclassResponsibility(String)
    case unsupportedContents(String)
    case outsideStore(String, store: String)
    case noSuchVersion(String)
    case cannotRemoveCurrentVersion
    case saveFailed(String)

    public var description: String {
        switch self {
        case .subclassResponsibility(let method): return "a Document subclass must override \(method)"
        case .unsupportedContents(let type):
            return
                "document contents must be Data or a FileWrapper, not \(type); override writeContents(_:to:for:originalContentsURL:)"
        case .outsideStore(let path, let store): return "\(path) is not a document of the store \(store)"
        case .noSuchVersion(let what): return "no such version: \(what)"
        case .cannotRemoveCurrentVersion: return "the current version cannot be removed (FV-3)"
        case .saveFailed(let name): return "\(name) could not be saved"
        }
    }

    public var errorDescription: String? { description }
}

/// Contents and attributes crossing from the main actor to the file-access executor, for a save.
/// `Data` and ``FileWrapper`` are thread-safe; the subclass hands them over and does not touch them
/// meanwhile, as with UIDocument's file-access queue.
// @unchecked because Apple's API, not a C type, forces it: `contents(forType:)` returns `Any`
// and `fileAttributesToWrite(to:for:)` `[AnyHashable: Any]`, which the compiler cannot send.
struct ContentsBox: @unchecked Sendable {
    let contents: Any
    var attributes: [AnyHashable: Any]? = nil

    init(_ contents: Any, attributes: [AnyHashable: Any]? = nil) {
        self.contents = contents
        self.attributes = attributes
    }
}

/// What a read brings back from the file-access executor: `Data` or a ``FileWrapper``, and for
/// a store document the version and document it came from.
struct ReadContents: Sendable {
    let contents: any Sendable
    let version: VersionID?
    let document: DocumentID?
}

/// The document's serial file-access queue (UD-33): reads and writes run one at a time, off the
/// main actor, on a thread that may block.
final class FileAccessQueue: Sendable {
    private let queue = DispatchQueue(label: "docfs.document.file-access")

    func run<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { continuation in
            queue.async { continuation.resume(with: Result { try body() }) }
        }
    }

    func run<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
        await withCheckedContinuation { continuation in
            queue.async { continuation.resume(returning: body()) }
        }
    }
}
