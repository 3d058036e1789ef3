import DocumentEngine
import Foundation
import Synchronization
import Testing

/// A model object that registers its own inverse, as Apple's documentation recommends.
private final class Counter {
    let undoManager: UndoManager
    var value = 0

    init(_ undoManager: UndoManager) { self.undoManager = undoManager }

    func add(_ amount: Int) {
        value += amount
        undoManager.registerUndo(withTarget: self) { $0.add(-amount) }
    }
}

private final class TodoList {
    let undoManager: UndoManager
    var items: [String] = []

    init(_ undoManager: UndoManager) { self.undoManager = undoManager }

    func insert(_ item: String, at index: Int) {
        items.insert(item, at: index)
        undoManager.registerUndo(withTarget: self) { $0.remove(at: index) }
        // Named only for a user edit: set while undoing, the name would go to the redo group.
        if !undoManager.isUndoing && !undoManager.isRedoing { undoManager.setActionName("Add \(item)") }
    }

    func remove(at index: Int) {
        let item = items.remove(at: index)
        undoManager.registerUndo(withTarget: self) { $0.insert(item, at: index) }
        if !undoManager.isUndoing && !undoManager.isRedoing { undoManager.setActionName("Remove \(item)") }
    }
}

/// Records notifications posted by one undo manager.
private final class NotificationRecorder {
    private let log = NotificationLog()
    private var tokens: [any NSObjectProtocol] = []

    static let all: [Notification.Name] = [
        UndoManager.checkpointNotification, UndoManager.willUndoChangeNotification,
        UndoManager.didUndoChangeNotification, UndoManager.willRedoChangeNotification,
        UndoManager.didRedoChangeNotification, UndoManager.didOpenUndoGroupNotification,
        UndoManager.willCloseUndoGroupNotification, UndoManager.didCloseUndoGroupNotification,
    ]

    init(_ manager: UndoManager) {
        let log = self.log
        for name in Self.all {
            // `object:` delivers only this manager's notifications: receiving one proves its object.
            tokens.append(
                NotificationCenter.default.addObserver(forName: name, object: manager, queue: nil) {
                    note in log.record(note)
                })
        }
    }

    deinit {
        for token in tokens { NotificationCenter.default.removeObserver(token) }
    }

    /// The names recorded since the last call.
    func take() -> [String] { takeWithUserInfo().map(\.0) }

    func takeWithUserInfo() -> [(String, [String: Bool])] { log.take() }
}

/// What a ``NotificationRecorder`` heard, behind a mutex: notifications arrive on the posting
/// thread.
private final class NotificationLog: Sendable {
    private let records = Mutex<[(name: String, userInfo: [String: Bool])]>([])

    func record(_ note: Notification) {
        let short = note.name.rawValue.replacingOccurrences(of: "NSUndoManager", with: "")
            .replacingOccurrences(of: "Notification", with: "")
        var info: [String: Bool] = [:]
        for (key, value) in note.userInfo ?? [:] {
            if let key = key as? String, let value = value as? Bool { info[key] = value }
        }
        records.withLock { $0.append((short, info)) }
    }

    func take() -> [(String, [String: Bool])] {
        records.withLock { records in
            defer { records.removeAll() }
            return records.map { ($0.name, $0.userInfo) }
        }
    }
}

@Suite struct UndoManagerTests {
    @Test("Undo and redo round trips of a counter with explicit groups")
    func counterRoundTrip() {
        let manager = UndoManager()
        manager.groupsByEvent = false
        let counter = Counter(manager)
        #expect(!manager.canUndo && !manager.canRedo)

        manager.beginUndoGrouping()
        counter.add(5)
        manager.endUndoGrouping()
        manager.beginUndoGrouping()
        counter.add(3)
        manager.endUndoGrouping()
        #expect(counter.value == 8)
        #expect(manager.canUndo && !manager.canRedo)

        manager.undo()
        #expect(counter.value == 5)
        #expect(manager.canUndo && manager.canRedo)
        manager.undo()
        #expect(counter.value == 0)
        #expect(!manager.canUndo && manager.canRedo)
        manager.undo()  // nothing left: no effect
        #expect(counter.value == 0)

        manager.redo()
        #expect(counter.value == 5)
        manager.redo()
        #expect(counter.value == 8)
        #expect(manager.canUndo && !manager.canRedo)
        manager.redo()  // nothing left
        #expect(counter.value == 8)
    }

    @Test("Handlers registered while undoing go to the redo stack, while redoing to the undo stack")
    func undoRegistersRedo() {
        let manager = UndoManager()
        let list = TodoList(manager)
        list.insert("milk", at: 0)
        manager.endEventGrouping()
        list.insert("eggs", at: 1)
        manager.endEventGrouping()
        #expect(list.items == ["milk", "eggs"])

        manager.undo()
        #expect(list.items == ["milk"])
        #expect(manager.redoActionName == "Add eggs")
        manager.undo()
        #expect(list.items == [])
        #expect(!manager.canUndo)

        manager.redo()
        #expect(list.items == ["milk"])
        // The handler run by redo registered its inverse on the undo stack, and did not clear
        // what remains to redo.
        #expect(manager.canUndo && manager.canRedo)
        #expect(manager.undoActionName == "Add milk")
        manager.redo()
        #expect(list.items == ["milk", "eggs"])
        manager.undo()
        manager.undo()
        manager.redo()
        manager.redo()
        #expect(list.items == ["milk", "eggs"])
    }

    @Test("A registration outside undo and redo clears the redo stack")
    func newRegistrationClearsRedo() {
        let manager = UndoManager()
        let counter = Counter(manager)
        counter.add(1)
        manager.undo()
        #expect(manager.canRedo)
        counter.add(2)
        #expect(!manager.canRedo)
        manager.redo()
        #expect(counter.value == 2)
    }

    @Test("groupsByEvent: a registration opens an implicit group that undo() closes first")
    func implicitGroupClosedByUndo() {
        let manager = UndoManager()
        let counter = Counter(manager)
        counter.add(1)
        counter.add(2)
        #expect(manager.groupingLevel == 1)
        #expect(manager.canUndo)
        manager.undo()  // closes the implicit group, then undoes both registrations as one step
        #expect(manager.groupingLevel == 0)
        #expect(counter.value == 0)
        #expect(!manager.canUndo)
        manager.redo()
        #expect(counter.value == 3)
    }

    @Test("Nested groups are undone as one; undoNestedGroup undoes only the last nested group")
    func nestedGroups() {
        let manager = UndoManager()
        manager.groupsByEvent = false
        let counter = Counter(manager)
        manager.beginUndoGrouping()
        counter.add(1)
        manager.beginUndoGrouping()
        counter.add(10)
        #expect(manager.groupingLevel == 2)
        manager.endUndoGrouping()
        counter.add(100)
        manager.endUndoGrouping()
        #expect(counter.value == 111)
        manager.undo()
        #expect(counter.value == 0)
        manager.redo()
        #expect(counter.value == 111)

        manager.beginUndoGrouping()
        counter.add(1000)
        manager.beginUndoGrouping()
        counter.add(10_000)
        manager.endUndoGrouping()
        manager.undoNestedGroup()
        #expect(counter.value == 1111)
        #expect(manager.groupingLevel == 1)
        manager.endUndoGrouping()
        manager.undo()
        #expect(counter.value == 111)
    }

    @Test("levelsOfUndo keeps only the newest top-level groups; lowering it drops at once")
    func levelsOfUndo() {
        let manager = UndoManager()
        manager.levelsOfUndo = 3
        let counter = Counter(manager)
        for amount in [1, 2, 4, 8, 16] {
            counter.add(amount)
            manager.endEventGrouping()
        }
        #expect(counter.value == 31)
        manager.undo()
        manager.undo()
        manager.undo()
        #expect(counter.value == 3)  // 1 and 2 were dropped
        #expect(!manager.canUndo)

        manager.redo()
        manager.redo()
        manager.redo()
        #expect(counter.value == 31)
        manager.levelsOfUndo = 1
        manager.undo()
        #expect(counter.value == 15)
        #expect(!manager.canUndo)
        manager.levelsOfUndo = 0
        #expect(manager.levelsOfUndo == 0)
    }

    @Test("Action names and menu item titles")
    func actionNames() {
        let manager = UndoManager()
        #expect(manager.undoActionName == "")
        #expect(manager.undoMenuItemTitle == "Undo")
        #expect(manager.redoMenuItemTitle == "Redo")
        let counter = Counter(manager)
        counter.add(1)
        manager.setActionName("Typing")
        #expect(manager.undoActionName == "Typing")
        #expect(manager.undoMenuItemTitle == "Undo Typing")
        manager.undo()
        #expect(manager.undoMenuItemTitle == "Undo")
        #expect(manager.redoActionName == "Typing")
        #expect(manager.redoMenuItemTitle == "Redo Typing")
        manager.redo()
        #expect(manager.undoMenuItemTitle == "Undo Typing")
        #expect(manager.redoMenuItemTitle == "Redo")

        // A name set inside an explicit group nested in the implicit one names the step.
        manager.beginUndoGrouping()
        counter.add(2)
        manager.setActionName("Paste")
        manager.endUndoGrouping()
        manager.endEventGrouping()
        #expect(manager.undoMenuItemTitle == "Undo Paste")
        #expect(manager.undoMenuTitle(forUndoActionName: "Cut") == "Undo Cut")
        #expect(manager.redoMenuTitle(forUndoActionName: "Cut") == "Redo Cut")
    }

    @Test(
        "disableUndoRegistration nests; removeAllActions re-enables, removeAllActions(withTarget:) does not")
    func registrationDisabledCounts() {
        let manager = UndoManager()
        let counter = Counter(manager)
        manager.disableUndoRegistration()
        manager.disableUndoRegistration()
        #expect(!manager.isUndoRegistrationEnabled)
        counter.add(1)
        manager.enableUndoRegistration()
        #expect(!manager.isUndoRegistrationEnabled)
        counter.add(2)
        #expect(!manager.canUndo)
        #expect(manager.groupingLevel == 0)
        manager.enableUndoRegistration()
        #expect(manager.isUndoRegistrationEnabled)
        counter.add(4)
        manager.undo()
        #expect(counter.value == 3)

        manager.disableUndoRegistration()
        manager.removeAllActions(withTarget: counter)
        #expect(!manager.isUndoRegistrationEnabled)
        manager.removeAllActions()
        #expect(manager.isUndoRegistrationEnabled)
        #expect(!manager.canUndo && !manager.canRedo)
    }

    @Test("removeAllActions(withTarget:) removes only that target's actions, and groups left empty")
    func removeAllActionsWithTarget() {
        let manager = UndoManager()
        let a = Counter(manager)
        let b = Counter(manager)
        a.add(1)
        manager.endEventGrouping()
        a.add(10)
        b.add(10)
        manager.endEventGrouping()
        b.add(100)  // still in the open implicit group
        manager.removeAllActions(withTarget: b)
        manager.undo()  // the open group is now empty: it closes and is discarded
        #expect(a.value == 1)
        #expect(b.value == 110)
        manager.undo()
        #expect(a.value == 0)
        #expect(!manager.canUndo)
    }

    @Test("An action whose target is gone is skipped (targets are held weakly)")
    func weakTarget() {
        let manager = UndoManager()
        var counter: Counter? = Counter(manager)
        weak let weakCounter = counter
        counter?.add(1)
        counter = nil
        #expect(weakCounter == nil)
        manager.undo()
        #expect(!manager.canUndo)
    }

    @Test("Notifications: Apple's names and order, object = the undo manager")
    func notificationsOrder() {
        let manager = UndoManager()
        let recorder = NotificationRecorder(manager)
        let counter = Counter(manager)

        counter.add(1)  // opens the implicit top-level group: no checkpoint
        #expect(recorder.take() == ["DidOpenUndoGroup"])
        manager.beginUndoGrouping()
        #expect(recorder.take() == ["Checkpoint", "DidOpenUndoGroup"])
        counter.add(2)
        manager.endUndoGrouping()
        let close = recorder.takeWithUserInfo()
        #expect(close.map(\.0) == ["Checkpoint", "WillCloseUndoGroup", "DidCloseUndoGroup"])
        #expect(close.last?.1 == [UndoManager.groupIsEmptyUserInfoKey: false])

        manager.undo()
        #expect(
            recorder.take() == [
                "Checkpoint", "Checkpoint", "WillCloseUndoGroup", "DidCloseUndoGroup", "Checkpoint",
                "WillUndoChange", "DidUndoChange",
            ])
        manager.redo()
        #expect(recorder.take() == ["Checkpoint", "WillRedoChange", "Checkpoint", "DidRedoChange"])

        // Discardable groups carry Apple's key.
        manager.groupsByEvent = false
        manager.beginUndoGrouping()
        #expect(recorder.take() == ["Checkpoint", "DidOpenUndoGroup"])
        manager.setActionIsDiscardable(true)
        counter.add(4)
        manager.endUndoGrouping()
        let discardable = recorder.takeWithUserInfo()
        #expect(
            discardable.last?.1 == [
                UndoManager.groupIsEmptyUserInfoKey: false, NSUndoManagerGroupIsDiscardableKey: true,
            ])
        #expect(manager.undoActionIsDiscardable)
        #expect(
            Notification.Name.NSUndoManagerDidCloseUndoGroup.rawValue
                == "NSUndoManagerDidCloseUndoGroupNotification")
    }

    @Test("Observer hook: close events with isEmpty and groupingLevel after the close; undo; redo")
    func observerHook() {
        let manager = UndoManager()
        var events: [UndoManager.Event] = []
        let token = manager.addObserver { events.append($0) }
        let counter = Counter(manager)

        counter.add(1)
        manager.beginUndoGrouping()
        counter.add(2)
        manager.endUndoGrouping()
        #expect(events == [.didCloseGroup(isEmpty: false, groupingLevel: 1)])
        manager.endEventGrouping()
        #expect(events.last == .didCloseGroup(isEmpty: false, groupingLevel: 0))
        events.removeAll()

        manager.undo()
        manager.redo()
        #expect(events == [.didUndo, .didRedo])  // no group events while undoing or redoing
        events.removeAll()

        manager.groupsByEvent = false
        manager.beginUndoGrouping()
        manager.endUndoGrouping()
        #expect(events == [.didCloseGroup(isEmpty: true, groupingLevel: 0)])
        #expect(manager.undoActionName == "")  // the empty group was discarded
        manager.undo()
        #expect(counter.value == 0)

        manager.removeObserver(token)
        events.removeAll()
        manager.redo()
        #expect(events.isEmpty)
    }

    @Test("UD-30: change counting wired to the observer hook returns to clean after undo")
    func changeCountingWiring() {
        let manager = UndoManager()
        var changeCount = 0
        manager.addObserver { event in
            switch event {
            case .didCloseGroup(let isEmpty, let level) where !isEmpty && level == 0: changeCount += 1
            case .didCloseGroup: break
            case .didUndo: changeCount -= 1
            case .didRedo: changeCount += 1
            }
        }
        let list = TodoList(manager)
        list.insert("a", at: 0)
        list.insert("b", at: 1)
        manager.endEventGrouping()
        #expect(changeCount == 1)
        list.remove(at: 0)
        manager.endEventGrouping()
        #expect(changeCount == 2)
        manager.undo()
        manager.undo()
        #expect(changeCount == 0)
        manager.redo()
        #expect(changeCount == 1)
    }

    @Test("On the main thread the implicit group closes on the next turn of the main queue")
    @MainActor
    func implicitGroupClosesOnMainQueue() async {
        let manager = UndoManager()
        var events: [UndoManager.Event] = []
        manager.addObserver { events.append($0) }
        let counter = Counter(manager)
        counter.add(1)
        counter.add(2)
        #expect(manager.groupingLevel == 1)
        // The close was queued first, so it has run once this later block runs.
        await withCheckedContinuation { continuation in
            DispatchQueue.main.async { continuation.resume() }
        }
        #expect(manager.groupingLevel == 0)
        #expect(events == [.didCloseGroup(isEmpty: false, groupingLevel: 0)])
        manager.undo()
        #expect(counter.value == 0)
    }
}
