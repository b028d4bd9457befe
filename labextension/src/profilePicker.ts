/**
 * The new-session form's profiles: a "Profile" list of the server's profiles (``GET
 * /profiles``) whose choice fills the form (`formOfRequest`), a note naming what the
 * profile sets that the form has no field for, and "Save as profile", which saves what the
 * form holds (checked as a start checks it) with ``PUT /profiles/NAME``.
 */
import { checkForm, fieldOfMessage, FormField, INewSession, requestOf } from './sessionRequest';
import { formOfRequest, IProfile, IProfileList, profileNameProblem, profileNote } from './profiles';
import { ApiError, requestAPI } from './request';

/** What the picker needs of the form. */
export interface IProfileForm {
  fill(values: Partial<INewSession>): void;
  fieldKinds(): Record<string, boolean>;
  getValue(): INewSession;
  showErrors(errors: Partial<Record<FormField | 'form', string>>): void;
  clear(name?: string): void;
}

function row(label: string, className: string, ...children: HTMLElement[]): HTMLElement {
  const element = document.createElement('label');
  element.className = `jp-DistForm-row ${className}`;
  const text = document.createElement('span');
  text.textContent = label;
  element.append(text, ...children);
  return element;
}

function line(className: string, role = 'status'): HTMLElement {
  const element = document.createElement('span');
  element.className = className;
  element.setAttribute('role', role);
  element.hidden = true;
  return element;
}

export class ProfilePicker {
  constructor(private form: IProfileForm) {
    this.select = document.createElement('select');
    this.select.name = 'profile';
    this.select.setAttribute('aria-label', 'Profile');
    this.select.addEventListener('change', () => this.choose());
    this.note = line('jp-DistForm-profileNote');
    this.note.id = 'jp-DistForm-profileNote';
    this.select.setAttribute('aria-describedby', this.note.id);
    this.top = row('Profile', 'jp-DistForm-profileRow', this.select, this.note);
    this.saveName = document.createElement('input');
    this.saveName.name = 'saveProfile';
    this.saveName.placeholder = 'profile name';
    this.saveName.setAttribute('aria-label', 'Profile name to save as');
    const button = document.createElement('button');
    button.type = 'button';
    button.className = 'jp-mod-styled jp-DistForm-save';
    button.textContent = 'Save as profile';
    button.addEventListener('click', () => void this.save());
    this.saved = line('jp-DistForm-profileNote');
    this.saved.id = 'jp-DistForm-profileSaved';
    this.saveError = line('jp-DistForm-error', 'alert');
    this.saveError.id = 'jp-DistForm-error-saveProfile';
    this.bottom = row('Save as', 'jp-DistForm-saveRow', this.saveName, button, this.saved, this.saveError);
    this.showList();
  }

  /** Enter in the name to save as saves (the dialog asks before it presses Start). */
  takesEnter(): boolean {
    if (document.activeElement !== this.saveName) {
      return false;
    }
    void this.save();
    return true;
  }

  /** The profile chosen, '' for none. */
  get chosen(): string {
    return this.select.value;
  }

  /** Ask the server for its profiles; the list says when it has none. */
  async load(selected = ''): Promise<void> {
    try {
      this.list = await requestAPI<IProfileList>('profiles');
    } catch (error) {
      const message = error instanceof ApiError ? error.message : `${error}`;
      this.list = { path: '', profiles: [], error: `the server's profiles could not be read: ${message}` };
    }
    this.showList(selected);
  }

  private showList(selected = ''): void {
    const profiles = this.list?.profiles ?? [];
    this.select.replaceChildren();
    const none = document.createElement('option');
    none.value = '';
    none.textContent = profiles.length ? '(none)' : '(no profiles)';
    this.select.appendChild(none);
    for (const profile of profiles) {
      const option = document.createElement('option');
      option.value = profile.name;
      option.textContent = `${profile.name} (${profile.launcher})`;
      this.select.appendChild(option);
    }
    this.select.value = profiles.some(p => p.name === selected) ? selected : '';
    if (this.list?.error) {
      this.say(this.note, this.list.error);
    } else if (this.list && !profiles.length) {
      this.say(this.note, `No profiles: ${this.list.path} has none; save this form as one.`);
    } else {
      this.say(this.note, '');
    }
  }

  /** Fill the form from the profile chosen. */
  private choose(): void {
    const profile = this.list?.profiles.find(p => p.name === this.select.value);
    if (!profile) {
      this.say(this.note, '');
      return;
    }
    this.fillFrom(profile);
  }

  private fillFrom(profile: IProfile): void {
    const { values, elsewhere } = formOfRequest(profile.request, this.form.fieldKinds());
    this.form.fill(values);
    this.say(this.note, profileNote(profile, this.list?.path ?? '', elsewhere));
    this.saveName.value = profile.name;
  }

  /** Save what the form holds as the profile named, checked first as a start is. */
  private async save(): Promise<void> {
    this.say(this.saved, '');
    this.say(this.saveError, '');
    const name = this.saveName.value.trim();
    const problem = profileNameProblem(name);
    if (problem) {
      this.say(this.saveError, problem);
      this.saveName.focus();
      return;
    }
    const value = this.form.getValue();
    this.form.clear();
    const wrong = checkForm(value);
    if (Object.keys(wrong).length) {
      this.form.showErrors(wrong);
      return;
    }
    try {
      const saved = await requestAPI<IProfile & { path: string }>(`profiles/${encodeURIComponent(name)}`, {
        method: 'PUT',
        body: JSON.stringify(requestOf(value))
      });
      await this.load(saved.name);
      this.say(this.saved, `Saved profile ${saved.name} in ${saved.path}`);
    } catch (error) {
      const message = error instanceof ApiError ? error.message : `${error}`;
      const field = fieldOfMessage(message);
      if (field) {
        this.form.showErrors({ [field]: message });
      } else {
        this.say(this.saveError, `Not saved: ${message}`);
      }
    }
  }

  private say(element: HTMLElement, text: string): void {
    element.textContent = text;
    element.hidden = !text;
  }

  /** The "Profile" row (the list and its note), for the top of the form. */
  readonly top: HTMLElement;
  /** The "Save as" row, for its bottom. */
  readonly bottom: HTMLElement;
  private select: HTMLSelectElement;
  private note: HTMLElement;
  private saveName: HTMLInputElement;
  private saved: HTMLElement;
  private saveError: HTMLElement;
  private list: IProfileList | null = null;
}
