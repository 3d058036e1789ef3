import Foundation

/// A general-purpose recorder of operations for undo and redo, with the API and semantics of
/// Foundation's `UndoManager` (which swift-corelibs-foundation does not provide).
///
/// An undo manager is not thread-safe and not `Sendable`: use each one from a single isolation
/// domain (one thread, one actor, typically the main actor), as Apple requires of its own.
///
/// ## Groups
/// Operations are recorded in groups; ``undo()`` reverts the most recent top-level group as one
/// step. With ``groupsByEvent`` (the default) a registration, ``setActionName(_:)`` or
/// ``beginUndoGrouping()`` made while no group is open first opens an *implicit* group, as Apple
/// does at the start of a run-loop pass. Linux has no run-loop pass that every program drives, so
/// the implicit group is closed, with the usual notifications, at the first of:
/// - ``undo()`` or ``redo()``;
/// - ``endUndoGrouping()`` called while it is the only open group;
/// - ``endEventGrouping()``, which ends the "event" explicitly;
/// - the next turn of the main dispatch queue, if the group was opened on that queue (the main
///   actor) and ``closesEventGroupsOnMainQueue`` is true (the default). Elsewhere nothing is
///   scheduled, so a program that uses an undo manager off the main queue calls
///   ``endEventGrouping()`` after each user-level edit.
///
/// An explicit group begun while the implicit group is open nests inside it, as on Apple systems.
///
/// ## Differences from Apple
/// - Targets are held weakly (Apple holds them unowned); an action whose target is gone is
///   skipped instead of crashing.
/// - A group that closes without any action is discarded rather than kept as an empty undo step;
///   its close notification says so (``groupIsEmptyUserInfoKey``, ``Event/didCloseGroup(isEmpty:groupingLevel:)``).
/// - Misuse that raises `NSInternalInconsistencyException` on Apple systems (unbalanced
///   grouping, undo with nested groups open) stops the program with `preconditionFailure`.
///
/// ## Notifications
/// Posted synchronously on `NotificationCenter.default` with the undo manager as object, under
/// Apple's names, and mirrored (group close, undo, redo) to observers added with
/// ``addObserver(_:)``. No group notifications are posted while undoing or redoing.
open class UndoManager {
    // MARK: Notification names

    /// Posted when a group opens or closes (except when a top-level group opens) and when undo or
    /// redo begins.
    public static let checkpointNotification = Notification.Name("NSUndoManagerCheckpointNotification")
    /// Posted just before an undo.
    public static let willUndoChangeNotification = Notification.Name(
        "NSUndoManagerWillUndoChangeNotification")
    /// Posted just after an undo.
    public static let didUndoChangeNotification = Notification.Name("NSUndoManagerDidUndoChangeNotification")
    /// Posted just before a redo.
    public static let willRedoChangeNotification = Notification.Name(
        "NSUndoManagerWillRedoChangeNotification")
    /// Posted just after a redo.
    public static let didRedoChangeNotification = Notification.Name("NSUndoManagerDidRedoChangeNotification")
    /// Posted after a group opens.
    public static let didOpenUndoGroupNotification = Notification.Name(
        "NSUndoManagerDidOpenUndoGroupNotification")
    /// Posted before a group closes.
    public static let willCloseUndoGroupNotification = Notification.Name(
        "NSUndoManagerWillCloseUndoGroupNotification")
    /// Posted after a group closes; ``groupingLevel`` is then the level outside the closed group.
    public static let didCloseUndoGroupNotification = Notification.Name(
        "NSUndoManagerDidCloseUndoGroupNotification")

    /// User-info key (a `Bool`) in the close notifications: the closed group held no action.
    ///
    /// UIKit's UIDocument reads this key (UD-30); Apple does not publish it.
    public static let groupIsEmptyUserInfoKey = "NSUndoManagerGroupIsEmpty"
    /// User-info key (a `Bool`, present only when true): the group was marked discardable.
    public static let groupIsDiscardableUserInfoKey = NSUndoManagerGroupIsDiscardableKey

    // MARK: Observer hook

    /// What an undo manager reports to observers added with ``addObserver(_:)``, synchronously
    /// and right after posting the matching notification.
    public enum Event: Equatable, Sendable {
        /// A group was closed outside undo and redo. `groupingLevel` is the level *after* the
        /// close (0 when a top-level group closed); `isEmpty` is true when it held no action.
        case didCloseGroup(isEmpty: Bool, groupingLevel: Int)
        /// An undo finished (`NSUndoManagerDidUndoChangeNotification`).
        case didUndo
        /// A redo finished (`NSUndoManagerDidRedoChangeNotification`).
        case didRedo
    }

    /// Identifies an observer added with ``addObserver(_:)``.
    public struct ObserverToken: Hashable, Sendable {
        fileprivate let id: Int
    }

    // MARK: State

    private struct Action {
        weak var target: AnyObject?
        let handler: (AnyObject) -> Void
    }

    private enum Item {
        case action(Action)
        case group(Group)
    }

    private final class Group {
        var items: [Item] = []
        var actionName: String?
        var isDiscardable = false
        let isImplicit: Bool

        init(isImplicit: Bool = false, actionName: String? = nil, isDiscardable: Bool = false) {
            self.isImplicit = isImplicit
            self.actionName = actionName
            self.isDiscardable = isDiscardable
        }

        var isEmpty: Bool { items.isEmpty }

        /// Its own name, else the name of its most recent named nested group: with
        /// groupsByEvent an app's named group usually nests inside the unnamed implicit one.
        var effectiveName: String? {
            if let actionName { return actionName }
            for case .group(let nested) in items.reversed() {
                if let name = nested.effectiveName { return name }
            }
            return nil
        }

        /// Removes the actions aimed at `target`, and nested groups that become empty.
        func removeActions(withTarget target: AnyObject) {
            items = items.compactMap { item in
                switch item {
                case .action(let action):
                    return action.target === target ? nil : item
                case .group(let nested):
                    nested.removeActions(withTarget: target)
                    return nested.isEmpty ? nil : item
                }
            }
        }

        /// Performs the group's actions, most recent first.
        func perform() {
            for item in items.reversed() {
                switch item {
                case .action(let action):
                    if let target = action.target { action.handler(target) }
                case .group(let nested):
                    nested.perform()
                }
            }
        }
    }

    /// Closed top-level groups, oldest first.
    private var undoStack: [Group] = []
    private var redoStack: [Group] = []
    /// Groups open outside undo and redo, outermost first.
    private var openGroups: [Group] = []
    /// While undoing (redoing): the groups being recorded for the redo (undo) stack.
    private var performGroups: [Group] = []
    private var disableCount = 0
    private var eventGeneration = 0
    private var eventEndScheduled = false
    private var observers: [(id: Int, body: (Event) -> Void)] = []
    private var nextObserverID = 0

    /// True while ``undo()`` or ``undoNestedGroup()`` runs.
    public private(set) var isUndoing = false
    /// True while ``redo()`` runs.
    public private(set) var isRedoing = false

    /// Whether registrations outside a group open an implicit group; see the type's discussion.
    /// The default is true.
    open var groupsByEvent = true

    /// Whether an implicit group opened on the main queue (the main actor) is closed on the next
    /// turn of that queue. The default is true.
    open var closesEventGroupsOnMainQueue = true

    /// The maximum number of top-level undo groups kept; 0 (the default) means no limit. Lowering
    /// it drops the oldest groups at once.
    open var levelsOfUndo = 0 {
        didSet {
            levelsOfUndo = max(0, levelsOfUndo)
            trim(&undoStack)
            trim(&redoStack)
        }
    }

    /// Creates an undo manager with empty stacks.
    public init() {}

    // MARK: Registration

    /// Records a closure that undoes a change to `target`; the closure receives `target`.
    ///
    /// Registered while undoing, it goes to the redo stack; while redoing, to the undo stack;
    /// otherwise to the undo stack, and the redo stack is cleared. Ignored while registration is
    /// disabled. `target` is held weakly.
    open func registerUndo<Target: AnyObject>(withTarget target: Target, handler: @escaping (Target) -> Void)
    {
        guard isUndoRegistrationEnabled else { return }
        if !isUndoing && !isRedoing { redoStack.removeAll() }
        prepareEventGrouping()
        guard let group = currentGroup else {
            preconditionFailure("UndoManager: must begin a group before registering undo")
        }
        group.items.append(
            .action(
                Action(target: target) { object in
                    // Only ever called with the registered target.
                    if let typed = object as? Target { handler(typed) }
                }))
    }

    /// Whether registrations are recorded; see ``disableUndoRegistration()``.
    open var isUndoRegistrationEnabled: Bool { disableCount == 0 }

    /// Stops recording registrations until a balancing ``enableUndoRegistration()``. Calls nest.
    open func disableUndoRegistration() {
        disableCount += 1
    }

    /// Balances one ``disableUndoRegistration()``.
    open func enableUndoRegistration() {
        precondition(
            disableCount > 0,
            "UndoManager: enableUndoRegistration may only be invoked with matching call to disableUndoRegistration"
        )
        disableCount -= 1
    }

    // MARK: Grouping

    /// The number of open groups: undo groups, or the redo group being recorded while undoing.
    open var groupingLevel: Int { isUndoing || isRedoing ? performGroups.count : openGroups.count }

    /// Opens a group, nested in any open group. Ignored while registration is disabled.
    open func beginUndoGrouping() {
        guard isUndoRegistrationEnabled else { return }
        if isUndoing || isRedoing {
            postCheckpoint()
            performGroups.append(Group())
            return
        }
        prepareEventGrouping()
        if !groupsByEvent || !openGroups.isEmpty { postCheckpoint() }
        openGroups.append(Group())
        post(Self.didOpenUndoGroupNotification)
    }

    /// Closes the innermost open group. Ignored while registration is disabled.
    open func endUndoGrouping() {
        guard isUndoRegistrationEnabled else { return }
        if isUndoing || isRedoing {
            postCheckpoint()
            guard let group = performGroups.popLast() else {
                preconditionFailure("UndoManager: endUndoGrouping called with no matching begin")
            }
            if !group.isEmpty, let parent = performGroups.last { parent.items.append(.group(group)) }
            return
        }
        closeOpenGroup()
    }

    /// Ends the implicit group opened by ``groupsByEvent``, as Apple does at the end of a
    /// run-loop pass. Does nothing if the implicit group is not the only open group.
    open func endEventGrouping() {
        guard !isUndoing, !isRedoing, openGroups.count == 1, openGroups[0].isImplicit else { return }
        closeOpenGroup()
    }

    /// Marks the current group as discardable (an undo that changes nothing persistent).
    open func setActionIsDiscardable(_ discardable: Bool) {
        guard isUndoRegistrationEnabled else { return }
        prepareEventGrouping()
        guard let group = currentGroup else {
            preconditionFailure("UndoManager: must begin a group before setting undo action discardability")
        }
        group.isDiscardable = discardable
    }

    /// Whether the group ``undo()`` would revert is discardable.
    open var undoActionIsDiscardable: Bool { nextUndoGroup?.isDiscardable ?? false }
    /// Whether the group ``redo()`` would perform is discardable.
    open var redoActionIsDiscardable: Bool { redoStack.last?.isDiscardable ?? false }

    // MARK: Undo and redo

    /// True if there is something to undo.
    open var canUndo: Bool { !undoStack.isEmpty || openGroups.first.map { !$0.isEmpty } == true }
    /// True if there is something to redo.
    open var canRedo: Bool { !redoStack.isEmpty }

    /// Closes the implicit top-level group if it is open, then reverts the most recent top-level
    /// group, recording its inverse on the redo stack.
    open func undo() {
        postCheckpoint()
        closeImplicitGroupIfOnlyOneOpen()
        precondition(
            openGroups.isEmpty, "UndoManager: undo was called with too many nested undo groups")
        undoNestedGroup()
    }

    /// Reverts the last closed group, top-level or nested in the open group, recording its
    /// inverse on the redo stack as one top-level group.
    open func undoNestedGroup() {
        postCheckpoint()
        precondition(!isUndoing && !isRedoing, "UndoManager: undoNestedGroup while undoing or redoing")
        let group: Group
        if let open = openGroups.last {
            guard case .group(let nested)? = open.items.last else {
                preconditionFailure("UndoManager: call endUndoGrouping before calling undoNestedGroup")
            }
            open.items.removeLast()
            group = nested
        } else {
            guard let last = undoStack.popLast() else { return }
            group = last
        }
        post(Self.willUndoChangeNotification)
        isUndoing = true
        performGroups = [Group(actionName: group.effectiveName, isDiscardable: group.isDiscardable)]
        group.perform()
        if let recorded = performGroups.first, !recorded.isEmpty {
            redoStack.append(recorded)
            trim(&redoStack)
        }
        performGroups = []
        isUndoing = false
        post(Self.didUndoChangeNotification, discardable: group.isDiscardable)
        emit(.didUndo)
    }

    /// Performs the most recent group on the redo stack, recording its inverse on the undo stack.
    /// Closes the implicit group first if it is open.
    open func redo() {
        precondition(!isUndoing && !isRedoing, "UndoManager: do not invoke redo while undoing or redoing")
        postCheckpoint()
        closeImplicitGroupIfOnlyOneOpen()
        precondition(openGroups.isEmpty, "UndoManager: redo was called with open undo groups")
        guard let group = redoStack.popLast() else { return }
        post(Self.willRedoChangeNotification)
        isRedoing = true
        performGroups = [Group(actionName: group.effectiveName, isDiscardable: group.isDiscardable)]
        group.perform()
        if let recorded = performGroups.first, !recorded.isEmpty {
            undoStack.append(recorded)
            trim(&undoStack)
        }
        performGroups = []
        isRedoing = false
        postCheckpoint()
        post(Self.didRedoChangeNotification, discardable: group.isDiscardable)
        emit(.didRedo)
    }

    // MARK: Clearing

    /// Clears both stacks and all open groups, and re-enables registration.
    open func removeAllActions() {
        undoStack.removeAll()
        redoStack.removeAll()
        openGroups.removeAll()
        performGroups.removeAll()
        disableCount = 0
        cancelEventEnd()
    }

    /// Removes every action aimed at `target` from both stacks and the open groups. Does not
    /// re-enable registration.
    open func removeAllActions(withTarget target: AnyObject) {
        for group in undoStack + redoStack + openGroups + performGroups {
            group.removeActions(withTarget: target)
        }
        undoStack.removeAll { $0.isEmpty }
        redoStack.removeAll { $0.isEmpty }
    }

    // MARK: Action names

    /// Names the current group's action (for example "Typing"), shown in ``undoMenuItemTitle``.
    /// Opens the implicit group if needed. Ignored while registration is disabled.
    open func setActionName(_ actionName: String) {
        guard isUndoRegistrationEnabled else { return }
        prepareEventGrouping()
        guard let group = currentGroup else {
            preconditionFailure("UndoManager: must begin a group before setting the action name")
        }
        group.actionName = actionName
    }

    /// The name of the action ``undo()`` would revert, or "".
    open var undoActionName: String { nextUndoGroup?.effectiveName ?? "" }
    /// The name of the action ``redo()`` would perform, or "".
    open var redoActionName: String { redoStack.last?.effectiveName ?? "" }

    /// "Undo" followed by ``undoActionName`` when there is one, for a menu item.
    open var undoMenuItemTitle: String {
        canUndo && !undoActionName.isEmpty ? undoMenuTitle(forUndoActionName: undoActionName) : "Undo"
    }
    /// "Redo" followed by ``redoActionName`` when there is one, for a menu item.
    open var redoMenuItemTitle: String {
        canRedo && !redoActionName.isEmpty ? redoMenuTitle(forUndoActionName: redoActionName) : "Redo"
    }

    /// The undo menu title for `actionName`; override to localize.
    open func undoMenuTitle(forUndoActionName actionName: String) -> String { "Undo \(actionName)" }
    /// The redo menu title for `actionName`; override to localize.
    open func redoMenuTitle(forUndoActionName actionName: String) -> String { "Redo \(actionName)" }

    // MARK: Observers

    /// Calls `body` synchronously with every ``Event`` until ``removeObserver(_:)``.
    ///
    /// This is how a document counts changes without NotificationCenter (UD-30):
    /// `.didCloseGroup(isEmpty: false, groupingLevel: l)` → `.done` (UIKit counts when
    /// `groupingLevel <= 1` as read in its close notification, which is the level after the
    /// close), `.didUndo` → `.undone`, `.didRedo` → `.redone`.
    @discardableResult
    open func addObserver(_ body: @escaping (Event) -> Void) -> ObserverToken {
        nextObserverID += 1
        observers.append((nextObserverID, body))
        return ObserverToken(id: nextObserverID)
    }

    /// Stops calling an observer added with ``addObserver(_:)``.
    open func removeObserver(_ token: ObserverToken) {
        observers.removeAll { $0.id == token.id }
    }

    // MARK: Internals

    /// The group registrations go to now.
    private var currentGroup: Group? { isUndoing || isRedoing ? performGroups.last : openGroups.last }

    /// The group ``undo()`` would revert: the open top-level group if it holds anything.
    private var nextUndoGroup: Group? {
        if let open = openGroups.first, !open.isEmpty || open.actionName != nil { return open }
        return undoStack.last
    }

    private func prepareEventGrouping() {
        guard groupsByEvent, !isUndoing, !isRedoing, openGroups.isEmpty else { return }
        openGroups.append(Group(isImplicit: true))
        scheduleEventEnd()
        post(Self.didOpenUndoGroupNotification)
    }

    private func closeImplicitGroupIfOnlyOneOpen() {
        if openGroups.count == 1, openGroups[0].isImplicit { closeOpenGroup() }
    }

    /// Closes the innermost open group outside undo and redo, with notifications.
    private func closeOpenGroup() {
        postCheckpoint()
        guard let group = openGroups.last else {
            preconditionFailure("UndoManager: endUndoGrouping called with no matching begin")
        }
        let isEmpty = group.isEmpty
        post(Self.willCloseUndoGroupNotification, empty: isEmpty, discardable: group.isDiscardable)
        openGroups.removeLast()
        if group.isImplicit { cancelEventEnd() }
        if !isEmpty {
            if let parent = openGroups.last {
                parent.items.append(.group(group))
            } else {
                undoStack.append(group)
                trim(&undoStack)
            }
        }
        post(Self.didCloseUndoGroupNotification, empty: isEmpty, discardable: group.isDiscardable)
        emit(.didCloseGroup(isEmpty: isEmpty, groupingLevel: openGroups.count))
    }

    private func trim(_ stack: inout [Group]) {
        if levelsOfUndo > 0, stack.count > levelsOfUndo {
            stack.removeFirst(stack.count - levelsOfUndo)
        }
    }

    private func scheduleEventEnd() {
        eventGeneration += 1
        guard closesEventGroupsOnMainQueue, MainQueueReference.isOnMainQueue else { return }
        eventEndScheduled = true
        let generation = eventGeneration
        let manager = MainQueueReference(self)
        DispatchQueue.main.async { manager.object?.processEndOfEvent(generation) }
    }

    private func cancelEventEnd() {
        eventEndScheduled = false
        eventGeneration += 1
    }

    private func processEndOfEvent(_ generation: Int) {
        guard eventEndScheduled, generation == eventGeneration else { return }
        if openGroups.count == 1, openGroups[0].isImplicit {
            closeOpenGroup()
        } else if openGroups.count > 1 {
            // An explicit group is still open across the turn: try again on the next one.
            let manager = MainQueueReference(self)
            DispatchQueue.main.async { manager.object?.processEndOfEvent(generation) }
        }
    }

    private var postingCheckpoint = false

    private func postCheckpoint() {
        // Observers of the checkpoint may open or close groups; do not recurse into them.
        guard !postingCheckpoint else { return }
        postingCheckpoint = true
        defer { postingCheckpoint = false }
        post(Self.checkpointNotification)
    }

    private func post(_ name: Notification.Name, empty: Bool? = nil, discardable: Bool = false) {
        var userInfo: [AnyHashable: Any] = [:]
        if let empty { userInfo[Self.groupIsEmptyUserInfoKey] = empty }
        if discardable { userInfo[Self.groupIsDiscardableUserInfoKey] = true }
        NotificationCenter.default.post(name: name, object: self, userInfo: userInfo.isEmpty ? nil : userInfo)
    }

    private func emit(_ event: Event) {
        for observer in observers { observer.body(event) }
    }
}

/// A weak reference handed to the main queue. The manager is confined to the main queue when it
/// schedules there (see ``UndoManager/closesEventGroupsOnMainQueue``), so the hop is safe.
// @unchecked because UndoManager is not Sendable (as Apple's is not) and libdispatch's C blocks
// take only @Sendable closures; `isOnMainQueue` checks at run time that the hop is main to main.
private struct MainQueueReference: @unchecked Sendable {
    weak var object: UndoManager?
    init(_ object: UndoManager) { self.object = object }

    private static let key: DispatchSpecificKey<Bool> = {
        let key = DispatchSpecificKey<Bool>()
        DispatchQueue.main.setSpecific(key: key, value: true)
        return key
    }()

    /// True on the main queue, which is where the main actor runs. (Under some Linux test
    /// runners the main queue is drained off the main thread, so `Thread.isMainThread` is not
    /// the right test.)
    static var isOnMainQueue: Bool { DispatchQueue.getSpecific(key: key) == true }
}

// swift-format-ignore: AlwaysUseLowerCamelCase
/// User-info key of the group-close and undo/redo notifications: the group is discardable.
public let NSUndoManagerGroupIsDiscardableKey = "NSUndoManagerGroupIsDiscardableKey"

// swift-format-ignore: AlwaysUseLowerCamelCase
// Apple's names, so code written against Foundation compiles unchanged.
extension Notification.Name {
    /// Apple's spelling of ``UndoManager/checkpointNotification``.
    public static let NSUndoManagerCheckpoint = UndoManager.checkpointNotification
    /// Apple's spelling of ``UndoManager/willUndoChangeNotification``.
    public static let NSUndoManagerWillUndoChange = UndoManager.willUndoChangeNotification
    /// Apple's spelling of ``UndoManager/didUndoChangeNotification``.
    public static let NSUndoManagerDidUndoChange = UndoManager.didUndoChangeNotification
    /// Apple's spelling of ``UndoManager/willRedoChangeNotification``.
    public static let NSUndoManagerWillRedoChange = UndoManager.willRedoChangeNotification
    /// Apple's spelling of ``UndoManager/didRedoChangeNotification``.
    public static let NSUndoManagerDidRedoChange = UndoManager.didRedoChangeNotification
    /// Apple's spelling of ``UndoManager/didOpenUndoGroupNotification``.
    public static let NSUndoManagerDidOpenUndoGroup = UndoManager.didOpenUndoGroupNotification
    /// Apple's spelling of ``UndoManager/willCloseUndoGroupNotification``.
    public static let NSUndoManagerWillCloseUndoGroup = UndoManager.willCloseUndoGroupNotification
    /// Apple's spelling of ``UndoManager/didCloseUndoGroupNotification``.
    public static let NSUndoManagerDidCloseUndoGroup = UndoManager.didCloseUndoGroupNotification
}
